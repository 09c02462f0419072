"""Rich displays for the notebooks: tables, figures, verdicts, progress and hints.

Every display here is a MIME bundle with an HTML part for JupyterLab and a ``text/plain`` part
that reads well in a console, in nbconvert's output and in the grader's executed notebooks.
HTML text wraps at word boundaries (JupyterLab's ``<pre>`` outputs break words anywhere).
Importing this module in an IPython kernel registers a PNG formatter for matplotlib figures, so
a picture function of ``labs/<lab>/viz.py`` can return a ``matplotlib.figure.Figure`` built
without pyplot (no global figure state, no double display) and a notebook cell shows it.
"""
from __future__ import annotations

import functools
import html
import io
import os
import re
import sys
import tempfile
from typing import Any, Callable, Iterable, Sequence

import grader

#: HTML style shared by every rich display: words wrap at their boundaries, never inside
_WRAP = "white-space:pre-wrap;overflow-wrap:anywhere;word-break:normal"


@functools.lru_cache(maxsize=1)
def _prefixes() -> tuple[str, ...]:
    """Folder prefixes to strip from printed paths, longest first: site-packages (torch's and
    the course's installs), the temp folder, the project's build folder and root."""
    import sysconfig

    root = str(grader.ROOT)
    found = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             tempfile.gettempdir(), os.path.join(root, "build"), root}
    return tuple(sorted((p.rstrip("/") + "/" for p in found if p), key=len, reverse=True))


def strip_paths(text: str) -> str:
    """``text`` with installation, temp and build folder prefixes removed from the paths in it
    (``/…/site-packages/torch/_ops.py`` becomes ``torch/_ops.py``), torch's own CI build prefix
    (``/__w/pytorch/pytorch/``) too, and the file IPython compiles a cell into
    (``/tmp/ipykernel_1/2.py``, a new name in every run) shown as ``<notebook cell>``."""
    text = re.sub(r"[\w./-]*ipykernel_\d+/\d+\.py", "<notebook cell>", text)
    for prefix in [*_prefixes(), "/__w/pytorch/pytorch/"]:
        text = text.replace(prefix, "")
    return text


def _cell(value: Any) -> str:
    return strip_paths(value if isinstance(value, str) else str(value))


class Table:
    """A table shown as HTML in JupyterLab and as aligned columns in plain text.

    ``rows``: sequences of cells (any objects; shown with ``str``, paths stripped);
    ``header``: the column names; ``caption``: a line shown above. Return it from a cell (or
    pass it to ``display``)."""

    def __init__(self, rows: Iterable[Sequence[Any]], header: Sequence[str], *,
                 caption: str = ""):
        self.header = [str(h) for h in header]
        self.rows = [[_cell(v) for v in row] for row in rows]
        self.caption = caption
        if any(len(row) != len(self.header) for row in self.rows):
            raise ValueError(f"every row needs {len(self.header)} cells, one per header column")

    def __repr__(self) -> str:
        widths = [max(len(r[i]) for r in [self.header, *self.rows])
                  for i in range(len(self.header))]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
        lines = [line(self.header), line(["-" * w for w in widths]), *map(line, self.rows)]
        return "\n".join(([self.caption] if self.caption else []) + lines)

    def _repr_html_(self) -> str:
        td = "padding:2px 10px;text-align:left;font-family:var(--jp-code-font-family,monospace)"
        head = "".join(f'<th style="{td}">{html.escape(h)}</th>' for h in self.header)
        body = "".join("<tr>" + "".join(f'<td style="{td};{_WRAP}">{html.escape(c)}</td>'
                                        for c in row) + "</tr>" for row in self.rows)
        caption = (f'<caption style="text-align:left">{html.escape(self.caption)}</caption>'
                   if self.caption else "")
        return (f'<table style="border-collapse:collapse;margin:4px 0">{caption}'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def table(rows: Iterable[Sequence[Any]], header: Sequence[str], *, caption: str = "") -> Table:
    """A :class:`Table` of ``rows`` under ``header`` (return it from a cell to show it).
    Raises ValueError when a row's length differs from the header's."""
    return Table(rows, header, caption=caption)


#: status -> (badge mark, colour) of a verdict and of a progress row
BADGES = {"passed": ("✓", "#1a7f37"), "skipped": ("–", "#6e7781"), "not run": ("·", "#6e7781")}
_FAILING = ("✗", "#cf222e")


def _badge(status: str) -> str:
    mark, colour = BADGES.get(status, _FAILING)
    return (f'<span style="background:{colour};color:#fff;border-radius:3px;padding:0 6px;'
            f'font-weight:600;white-space:nowrap">{mark} {html.escape(status)}</span>')


def _inline_code(text: str) -> str:
    """Escaped ``text`` with its `backquoted` spans as ``<code>``."""
    parts = html.escape(strip_paths(text)).split("`")
    if len(parts) % 2 == 0:  # an unmatched backquote: leave the text as it is
        return "`".join(parts)
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def verdict(exercise_id: str, title: str, status: str, message: str) -> dict[str, str]:
    """A self-check verdict as a MIME bundle: a ✓/✗ badge, the exercise, and the message
    (wrapping at word boundaries, its `quoted code` as code); ``text/plain`` is one line."""
    mark, colour = BADGES.get(status, _FAILING)
    text = f"{mark} {exercise_id}: {status} — {strip_paths(message)}"
    page = (f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:2px 0">'
            f"{_badge(status)} <b>{html.escape(exercise_id)}</b> · {html.escape(title)}"
            f'<div style="{_WRAP};margin-top:4px">{_inline_code(message)}</div></div>')
    return {"text/plain": text, "text/html": page}


def warning(title: str, message: str) -> dict[str, str]:
    """A warning as a MIME bundle: a ⚠ badge, ``title`` in bold, and ``message`` (wrapping at
    word boundaries, its `quoted code` as code); ``text/plain`` is ``⚠ title: message``."""
    colour = "#9a6700"
    page = (f'<div style="border-left:4px solid {colour};padding:4px 10px;margin:2px 0">'
            f'<span style="background:{colour};color:#fff;border-radius:3px;padding:0 6px;'
            f'font-weight:600">⚠ warning</span> <b>{html.escape(title)}</b>'
            f'<div style="{_WRAP};margin-top:4px">{_inline_code(message)}</div></div>')
    return {"text/plain": f"⚠ {title}: {strip_paths(message)}", "text/html": page}


def progress(title: str, rows: Sequence[tuple[str, str, str, float, float]]) -> dict[str, str]:
    """A lab's progress as a MIME bundle. ``rows``: (exercise id, title, status of its last
    self-check, ``not run``, or ``skipped`` for one this machine cannot run, points if the
    hidden checks pass too, max points). The summary counts what can run here; the points of
    the skipped exercises are told apart."""
    here = [r for r in rows if r[2] != "skipped"]
    done = [r for r in here if r[2] == "passed"]
    got, most = sum(r[3] for r in here), sum(r[4] for r in here)
    summary = (f"{title}: {len(done)} of {len(here)} exercises pass their public checks, worth "
               f"{got:g} of {most:g} points (the grader also runs hidden checks)")
    if elsewhere := [r for r in rows if r[2] == "skipped"]:
        one = len(elsewhere) == 1
        summary += (f"; {len(elsewhere)} more, worth {sum(r[4] for r in elsewhere):g} points, "
                    f"{'needs' if one else 'need'} what this machine lacks (a GPU) and "
                    f"{'is' if one else 'are'} graded where it is")
    plain = Table([(r[2], r[0], r[1], f"{r[3]:g}/{r[4]:g}") for r in rows],
                  ["status", "exercise", "title", "points"], caption=summary)
    td = "padding:2px 10px;text-align:left"
    body = "".join(f'<tr><td style="{td}">{_badge(status)}</td><td style="{td}"><code>'
                   f'{html.escape(ex)}</code></td><td style="{td}">{html.escape(name)}</td>'
                   f'<td style="{td}">{got_:g} / {most_:g}</td></tr>'
                   for ex, name, status, got_, most_ in rows)
    page = (f'<div style="{_WRAP}"><b>{html.escape(summary)}</b></div>'
            f'<table style="border-collapse:collapse;margin:4px 0">{body}</table>')
    return {"text/plain": repr(plain), "text/html": page}


def hint(exercise_id: str, number: int, total: int, text: str) -> dict[str, str]:
    """Hint ``number`` of ``total`` for an exercise as a MIME bundle (``text`` is markdown)."""
    from markdown_it import MarkdownIt

    head = f"Hint {number} of {total} for {exercise_id}"
    page = (f'<div style="border-left:4px solid #9a6700;padding:2px 10px;margin:2px 0;'
            f'line-height:1.5">'
            f"<b>{html.escape(head)}</b>{MarkdownIt().render(text)}</div>")
    return {"text/plain": f"{head}: {text}", "text/html": page}


def figure_png(fig) -> bytes:
    """A matplotlib ``Figure`` as PNG bytes (tight bounding box, 110 dpi)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def figure_html(fig) -> str:
    """A matplotlib ``Figure`` as an HTML ``<img>`` (inline PNG), for an ``ipywidgets.HTML``."""
    import base64

    data = base64.b64encode(figure_png(fig)).decode("ascii")
    return f'<img src="data:image/png;base64,{data}" style="max-width:100%">'


def show_cached(picture, cache: dict, key: Any, render: Callable[[], str], working: str,
                controls: Sequence = ()) -> None:
    """Show ``cache[key]`` in ``picture`` (an ``ipywidgets.HTML``), first computing it with
    ``render()`` (HTML) when ``key`` is not cached. While it computes, the picture shows a busy
    sign (⏳ and ``working``, e.g. "explaining f with torch._dynamo.explain") above the last
    picture, and ``controls`` (the explorer's widgets) are disabled, so a learner sees that the
    kernel is busy and queues no more work meanwhile; they are enabled again afterwards. When
    ``render`` raises, the picture says so in place of the busy sign, and the exception is
    passed on."""
    if key not in cache:
        last = picture.value
        picture.value = (f'<p style="color:#555;margin:2px 0">⏳ <i>{html.escape(working)}'
                         f'…</i></p>{last}')
        for control in controls:
            control.disabled = True
        try:
            cache[key] = render()
        except Exception as exc:
            picture.value = (f'<p style="color:#b42318;margin:2px 0">✗ {html.escape(working)} '
                             f"failed: {html.escape(f'{type(exc).__name__}: {exc}')}</p>{last}")
            raise
        finally:
            for control in controls:
                control.disabled = False
    picture.value = cache[key]


def _register_figure_formatter() -> None:
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython else None
    if shell is None:
        return
    from matplotlib.figure import Figure

    shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)


_register_figure_formatter()
