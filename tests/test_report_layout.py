"""The HTML reports fit the page: given a class of two labs with long exercise ids and titles,
every table of summary.html and of the feedback fits the page's column at a 1100 px wide
window. A structural test runs everywhere; the real measurement needs Python Playwright and a
Chromium at /usr/bin/chromium (``apt-get install chromium``; never ``playwright install``) and
is skipped where either is missing (CI has neither)."""
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grader.reports.feedback import feedback_html
from grader.reports.graded import Graded
from grader.reports.summary import summary_html
from grader.results import STATUSES, Environment, ExerciseResult, LabResult

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ENV = Environment("2.13.0+cpu", "cpu", 7, "0.1.0", "3.11.7", "2026-01-01T00:00:00+00:00")
LABS = {
    "autograd": [
        ("autograd.saved-tensor-hooks",
         "Saved-tensor hooks: pack activations to CPU and unpack them on demand"),
        ("autograd.topo-backward", "A backward engine with dependency counting and a ready queue"),
        ("autograd.checkpoint-recompute",
         "Activation checkpointing that recomputes the forward in backward")],
    "dispatcher": [
        ("dispatcher.privateuse1",
         "A PrivateUse1 backend registered with torch.library, with CPU and Meta kernels"),
        ("dispatcher.dispatch-key-priority",
         "Which kernel runs: DispatchKeySet priority computed by hand")]}


def _class() -> list[Graded]:
    """Three learners, each with both labs; every status occurs."""
    graded = []
    for i, learner in enumerate(["alice.smith", "bob", "carol-ann"]):
        for lab, exercises in LABS.items():
            results = tuple(
                ExerciseResult(eid, title, STATUSES[(i + j) % len(STATUSES)], (i + j) % 3, 3,
                               "`run_backward` is not defined", 1.5)
                for j, (eid, title) in enumerate(exercises))
            graded.append(Graded(f"{learner}_02_{lab}", learner,
                                 LabResult(lab=lab, notebook=f"02_{lab}.ipynb",
                                           exercises=results, environment=ENV, duration_s=3.0)))
    return graded


PAGES = {"summary": lambda: summary_html(_class()), "feedback": lambda: feedback_html(_class()[0])}


class _Tables(HTMLParser):
    """Each <table>'s parent element (tag, class)."""

    def __init__(self):
        super().__init__()
        self.stack: list[tuple[str, str]] = []
        self.parents: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.parents.append(self.stack[-1])
        if tag not in ("wbr", "br", "img", "meta"):
            self.stack.append((tag, dict(attrs).get("class") or ""))

    def handle_endtag(self, tag):
        if tag not in ("wbr", "br", "img", "meta"):
            assert self.stack.pop()[0] == tag


@pytest.mark.parametrize("page", PAGES)
def test_every_table_sits_in_a_scrolling_container_and_headers_may_wrap(page):
    html = PAGES[page]()
    parser = _Tables()
    parser.feed(html)
    assert parser.parents
    assert all(p == ("div", "table-wrap") for p in parser.parents), parser.parents
    css = re.sub(r"/\*.*?\*/", "", html.split("<style>")[1].split("</style>")[0], flags=re.S)
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", css))
    assert any("overflow-x: auto" in body for sel, body in rules.items()
               if ".table-wrap" in sel)
    for selectors, body in rules.items():  # a header cell never refuses to wrap
        for sel in selectors.split(","):
            assert not (re.search(r"\bth\b", sel) and "nowrap" in body), sel
    assert not re.search(r"<th[^>]*style=", html)
    # ids may break after . and - (and only there)
    assert "autograd.<wbr>saved-<wbr>tensor-<wbr>hooks" in html


def _measure(html: str) -> list[dict]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.set_content(html)
            return page.evaluate("""() => {
              const body = getComputedStyle(document.body);
              const column = document.body.clientWidth - parseFloat(body.paddingLeft)
                             - parseFloat(body.paddingRight);
              return [...document.querySelectorAll('table')].map(t => ({
                table: Math.max(t.scrollWidth, t.offsetWidth), column: column,
                container: t.parentElement.clientWidth, scroll: t.parentElement.scrollWidth,
                page: document.documentElement.scrollWidth}));
            }""")
        finally:
            browser.close()


def _no_browser() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "needs Python Playwright (pip install playwright; not a project dependency)"
    if not CHROMIUM.is_file():
        return f"needs Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


NO_BROWSER = _no_browser()


@pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))
@pytest.mark.parametrize("page", PAGES)
def test_every_table_fits_the_column_of_an_1100_px_window_in_chromium(page):
    widths = _measure(PAGES[page]())
    assert widths
    for w in widths:
        # the table is no wider than the column, so its container need not scroll
        assert w["table"] <= w["column"] and w["scroll"] <= w["container"], widths
        assert w["page"] <= 1100, widths


@pytest.mark.skipif(NO_BROWSER is not None, reason=str(NO_BROWSER))
def test_a_very_long_word_scrolls_its_table_not_the_page_in_chromium():
    g = _class()[0]
    word = "x" * 400  # no place to break: the container scrolls, the page keeps its width
    first = g.result.exercises[0]
    result = LabResult(lab=g.result.lab, notebook=g.result.notebook, environment=ENV,
                       exercises=(ExerciseResult(first.id, word, "passed", 3, 3, "", 1.0),))
    for html in (summary_html([Graded(g.name, g.learner, result)]),
                 feedback_html(Graded(g.name, g.learner, result))):
        widths = _measure(html)
        assert any(w["scroll"] > w["container"] for w in widths), widths
        assert all(w["page"] <= 1100 and w["container"] <= w["column"] for w in widths), widths
