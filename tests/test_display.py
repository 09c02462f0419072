"""grader.kernel.display: the rich displays' HTML and text parts."""
import sysconfig
import tempfile

import pytest
from matplotlib.figure import Figure

from grader.kernel.display import (figure_html, figure_png, show_cached, strip_paths, table,
                                   verdict)


def test_paths_lose_their_install_temp_and_build_prefixes():
    lib = sysconfig.get_paths()["purelib"]
    text = (f"{lib}/torch/_ops.py and {tempfile.gettempdir()}/ipykernel_7/3.py and "
            "/__w/pytorch/pytorch/aten/src/ATen/core/boxing/KernelFunction.cpp")
    assert strip_paths(text) == ("torch/_ops.py and <notebook cell> and "
                                 "aten/src/ATen/core/boxing/KernelFunction.cpp")


def test_a_table_is_html_with_aligned_text_and_escapes_its_cells():
    t = table([(1, "<b>"), (22, f"{sysconfig.get_paths()['purelib']}/torch/x.py")],
              ["n", "what"], caption="two rows")
    assert repr(t).splitlines() == ["two rows", "n   what", "--  ----------", "1   <b>",
                                    "22  torch/x.py"]
    page = t._repr_html_()
    assert "&lt;b&gt;" in page and "<b>" not in page and page.count("<tr>") == 3
    assert "<caption" in page and "torch/x.py" in page and "site-packages" not in page


def test_a_table_refuses_a_row_of_the_wrong_length():
    with pytest.raises(ValueError, match="every row needs 2 cells"):
        table([(1, 2, 3)], ["a", "b"])


def test_a_verdict_wraps_at_words_and_shows_quoted_code_as_code():
    bundle = verdict("toy.add", "Add <two>", "error", "raised at line 3 of your cell: `x = a < b`")
    assert bundle["text/plain"] == "✗ toy.add: error — raised at line 3 of your cell: `x = a < b`"
    page = bundle["text/html"]
    assert "<code>x = a &lt; b</code>" in page and "Add &lt;two&gt;" in page
    assert "word-break:normal" in page and "overflow-wrap:anywhere" in page and "<pre" not in page
    odd = verdict("toy.add", "t", "failed", "an unmatched ` stays as it is")["text/html"]
    assert "an unmatched ` stays" in odd and "<code>" not in odd


def test_a_figure_becomes_png_and_an_inline_image():
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1])
    assert figure_png(fig).startswith(b"\x89PNG")
    assert figure_html(fig).startswith('<img src="data:image/png;base64,iVBOR')


def test_an_explorer_shows_a_busy_sign_and_disables_its_controls_while_it_computes():
    import ipywidgets as widgets

    picture, cache, slider = widgets.HTML("<img>old</img>"), {}, widgets.IntSlider()
    seen = []

    def render():
        seen.append((picture.value, slider.disabled))
        return "<p>step 2</p>"

    show_cached(picture, cache, 2, render, "drawing step <2>", [slider])
    assert seen == [('<p style="color:#555;margin:2px 0">⏳ <i>drawing step &lt;2&gt;…</i></p>'
                     "<img>old</img>", True)]
    assert (picture.value, slider.disabled) == ("<p>step 2</p>", False)
    assert cache == {2: "<p>step 2</p>"}
    show_cached(picture, cache, 2, render, "drawing step 2", [slider])
    assert len(seen) == 1  # cached: drawn once

    def fails():
        raise RuntimeError("the learner's function failed")

    with pytest.raises(RuntimeError):
        show_cached(picture, cache, 3, fails, "drawing step 3", [slider])
    assert slider.disabled is False and 3 not in cache and "⏳" not in picture.value
    assert "drawing step 3 failed: RuntimeError: the learner&#x27;s function failed" in picture.value
