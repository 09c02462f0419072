"""Report formats: every one a pure function of the graded results (:class:`Graded`), in one
module each, written atomically so that an interrupted run never leaves a half-written report.

- :mod:`~grader.reports.gradebook`: one CSV row per learner, one column per exercise, totals;
- :mod:`~grader.reports.feedback`: per-submission feedback (Markdown, HTML) with the relevant
  outputs of the learner's answer cells and added cells (never the grader's cells or
  tracebacks);
- :mod:`~grader.reports.junit`: one testsuite per (learner, lab), one testcase per exercise;
- :mod:`~grader.reports.gradescope`: Gradescope's ``results.json`` (the subset described by
  ``grader/gradescope.schema.json``);
- :mod:`~grader.reports.summary`: per-lab and per-exercise statistics and a histogram of lab
  scores;
- :mod:`~grader.reports.console`: the tables the CLI prints;
- :func:`write_reports`: all the files above into one folder.

Scores are points; durations are wall seconds. Every report shows the score over the whole lab
and over what could run on the grading machine (``runnable_max_score``: skipped exercises,
such as those needing CUDA on a CPU runner, count in the first and not in the second), so a CPU
runner's reports and a GPU runner's compare. Reports only read results.
"""
from __future__ import annotations

from pathlib import Path

from grader.files import atomic_write
from grader.reports.feedback import feedback_html, feedback_markdown
from grader.reports.gradebook import gradebook_rows, write_gradebook_csv
from grader.reports.graded import Graded, check_names
from grader.reports.gradescope import write_gradescope_json
from grader.reports.junit import write_junit_xml
from grader.reports.summary import summary_html


def write_reports(graded: list[Graded], out_dir: Path,
                  assigned: dict[str, float] | None = None) -> list[Path]:
    """Write every report for ``graded`` under ``out_dir``: ``gradebook.csv``, ``junit.xml``,
    ``summary.html`` and, per submission, ``feedback/<name>.md``, ``feedback/<name>.html`` and
    ``gradescope/<name>.json``; each file atomically. Return the paths written, in that order.
    ``assigned`` (lab id -> maximum points) fixes the gradebook's labs (:func:`gradebook_rows`).

    Raises ValueError (no results, names that are not unique plain file names, two results of
    one learner for one lab) before writing anything; OSError when a file cannot be written
    (the files already written stay, each complete)."""
    if not graded:
        raise ValueError("no results to report")
    check_names(graded)
    gradebook_rows(graded, assigned)  # raises on conflicting rows before anything is written
    out_dir = Path(out_dir)
    written = [write_gradebook_csv(graded, out_dir / "gradebook.csv", assigned),
               write_junit_xml(graded, out_dir / "junit.xml"),
               atomic_write(out_dir / "summary.html", summary_html(graded))]
    for g in graded:
        written += [atomic_write(out_dir / "feedback" / f"{g.name}.md", feedback_markdown(g)),
                    atomic_write(out_dir / "feedback" / f"{g.name}.html", feedback_html(g)),
                    write_gradescope_json(g.result, out_dir / "gradescope" / f"{g.name}.json")]
    return written
