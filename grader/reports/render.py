"""Plain text made safe for the reports: Markdown escaped outside code spans, HTML escaped with
code spans as ``<code>``, and the jinja2 environments (with these filters) that render the
report templates in ``grader/reports/templates/``."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import jinja2
from markupsafe import Markup, escape

from grader.reports.graded import num, pct

#: the escape sequences of terminal colours, which a learner's output may hold

_MD_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "*": "\\*", "_": "\\_",
               "[": "\\[", "]": "\\]"}


def _spans(text: str) -> Iterator[tuple[bool, str]]:
    """``text`` cut into (is_code, part): code spans as CommonMark reads them (a run of
    backticks up to the next run of as many), backticks included, and the plain text between."""
    start = i = 0
    while (i := text.find("`", i)) >= 0:
        run = len(text) - i - len(text[i:].lstrip("`"))
        end = re.compile(rf"(?<!`){'`' * run}(?!`)").search(text, i + run)
        if end is None:  # no closing run: these backticks are plain text
            i += run
            continue
        if start < i:
            yield False, text[start:i]
        yield True, text[i:end.end()]
        start = i = end.end()
    if start < len(text):
        yield False, text[start:]


def _md(text: object) -> str:
    """Markdown text from plain ``text``: outside code spans ``&``, ``<``, ``>`` become entities
    (so no raw HTML reaches a renderer) and ``\\ * _ [ ]`` are backslash-escaped (so
    ``__torch_dispatch__`` is not bold); code spans (`` `...` ``) are kept as written."""
    return "".join(part if code else "".join(_MD_ESCAPES.get(c, c) for c in part)
                   for code, part in _spans(str(text)))


def _html_code(text: object) -> Markup:
    """HTML from plain ``text`` with its Markdown code spans (`` `...` ``) as ``<code>``
    elements; everything else, and the code itself, escaped."""
    out = []
    for code, part in _spans(str(text)):
        if code:
            part = part.strip("`")  # the fences (the code itself neither starts nor ends with `)
            if part.startswith(" ") and part.endswith(" ") and part.strip(" "):
                part = part[1:-1]  # as CommonMark: one space each side lets code touch a `
            out.append(Markup("<code>%s</code>") % part)
        else:
            out.append(escape(part))
    return Markup("").join(out)


def _breakable(text: object) -> Markup:
    """``text`` escaped, with a line break allowed (``<wbr>``) after each ``. - _ /``, so that
    an id such as ``autograd.saved-tensor-hooks`` can wrap in a narrow table column."""
    return Markup("<wbr>").join(escape(p) for p in re.split(r"(?<=[-._/])(?=.)", str(text)))


def _md_cell(text: object) -> str:
    """:func:`_md` for a table cell: one line, ``|`` escaped."""
    return _md(" ".join(str(text).split())).replace("|", "\\|")


def _md_item(text: object) -> str:
    """:func:`_md` for a list item: continuation lines indented under the bullet."""
    return _md(text).replace("\n", "\n  ")


def _md_code(text: object) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds."""
    text = " ".join(str(text).split())
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks in ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


_ENV_ARGS = dict(loader=jinja2.PackageLoader("grader.reports", "templates"),
                undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                keep_trailing_newline=True)
#: HTML pages: everything escaped; ``code`` and ``breakable`` filters
HTML = jinja2.Environment(autoescape=True, **_ENV_ARGS)
HTML.filters.update(code=_html_code, breakable=_breakable)
#: Markdown pages: nothing escaped unless a template asks (``md``, ``md_cell``, ...)
MARKDOWN = jinja2.Environment(autoescape=False, **_ENV_ARGS)
MARKDOWN.filters.update(md=_md, md_cell=_md_cell, md_item=_md_item, md_code=_md_code,
                        fence=_fence)
for _env in (HTML, MARKDOWN):
    # file_name: learners see their notebook's name, not the folders it was graded from
    # num1: statistics (means, medians) with at most 1 decimal, as people read them
    _env.filters.update(num=num, num1=lambda x: num(round(float(x), 1)), pct=pct,
                        file_name=lambda p: Path(p).name)
