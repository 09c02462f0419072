"""The class summary: per-lab and per-exercise statistics (JSON-able), a histogram of lab scores,
and one HTML page linking every submission's feedback."""
from __future__ import annotations

import base64
import io
import statistics
from collections import Counter

from grader.reports.graded import Graded, best_first, lab_order, num
from grader.reports.render import HTML
from grader.results import CAVEAT_MARK, STATUSES

#: equal-width bins of the lab-score histogram, from 0 to the lab's maximum
HISTOGRAM_BINS = 10
#: submissions a lab needs for summary.html to draw its histogram (one score is no distribution,
#: and drawing it took most of the report time of a one-notebook grading: 0.8 s)
HISTOGRAM_MIN_SUBMISSIONS = 2


def _stats(values: list[float]) -> dict:
    return {"mean": round(statistics.fmean(values), 4),
            "median": round(statistics.median(values), 4),
            "min": round(min(values), 4), "max": round(max(values), 4)}


def _histogram(scores: list[float], maximum: float) -> dict:
    """:data:`HISTOGRAM_BINS` equal bins over [0, maximum] (the last one closed), as numpy's."""
    import numpy as np

    counts, edges = np.histogram(scores, bins=HISTOGRAM_BINS, range=(0.0, maximum or 1.0))
    return {"edges": [round(float(x), 4) for x in edges], "counts": [int(c) for c in counts]}


def class_summary(graded: list[Graded]) -> dict:
    """Statistics of a class's results (a JSON-able dict).

    Top level: ``submissions``, ``learners`` (distinct), ``ungraded`` (the results with no
    exercises: ``name``, ``learner``, ``error``) and ``labs``, by lab id in first-seen order:

    - ``submissions`` (one per learner: the best), ``grading_errors`` (results with ``error``
      set), ``devices`` (count per device), ``max_score`` (points, the largest maximum seen);
    - ``score``: ``mean``, ``median``, ``min``, ``max`` in points;
    - ``mean_fraction`` (mean of score / max_score: over the whole lab) and
      ``mean_runnable_fraction`` (mean of score / runnable_max_score over the submissions where
      something could run: over what could run), in [0, 1], None when undefined;
    - ``scores`` (sorted) and ``histogram`` (``edges``, ``counts``: :data:`HISTOGRAM_BINS` equal
      bins over [0, max_score], the last closed);
    - ``exercises`` by id: ``title``, ``max_points``, ``submissions``, ``ran`` (not skipped),
      ``counts`` per status (every status, 0 included), ``mean_points`` and ``pass_rate``
      (passed / ran), both over the submissions that ran it, None when none did, and
      ``version_caveats`` (the results that mark it ``version_caveat``);
    - ``torch_mismatch``: None when every submission ran on the pinned torch, else ``pinned``
      (the release) and ``versions`` (count per other torch version it ran with).

    A lab's statistics count one result per learner, the best, as the gradebook does (two
    copies handed in by one learner are one submission there).

    Raises ValueError for an empty list."""
    if not graded:
        raise ValueError("no results to summarize")
    best = best_first(graded)
    labs: dict[str, dict] = {}
    for lab, exercises in lab_order(graded).items():
        mine = [results[0].result for (_, of), results in best.items() if of == lab]
        scores = [r.score for r in mine]
        maximum = max(r.max_score for r in mine)
        whole = [r.score / r.max_score for r in mine if r.max_score]
        runnable = [r.score / r.runnable_max_score for r in mine if r.runnable_max_score]
        devices: dict[str, int] = {}
        for r in mine:
            devices[r.environment.device] = devices.get(r.environment.device, 0) + 1
        per_ex = {}
        for eid, title in exercises:
            results = [e for r in mine for e in r.exercises if e.id == eid]
            ran = [e for e in results if e.status != "skipped"]
            per_ex[eid] = {
                "title": title, "max_points": max(e.max_points for e in results),
                "submissions": len(results), "ran": len(ran),
                "counts": {s: sum(e.status == s for e in results) for s in STATUSES},
                "mean_points": round(statistics.fmean(e.points for e in ran), 4) if ran else None,
                "pass_rate": (round(sum(e.status == "passed" for e in ran) / len(ran), 4)
                              if ran else None),
                "version_caveats": sum(e.version_caveat for e in results)}
        others = [r.environment for r in mine if r.environment.torch_mismatch]
        mismatch = None if not others else {
            "pinned": others[0].torch_pinned,
            "versions": dict(Counter(env.torch_version for env in others))}
        labs[lab] = {
            "submissions": len(mine), "grading_errors": sum(r.error is not None for r in mine),
            "devices": devices, "max_score": maximum, "score": _stats(scores),
            "mean_fraction": round(statistics.fmean(whole), 4) if whole else None,
            "mean_runnable_fraction": round(statistics.fmean(runnable), 4) if runnable else None,
            "scores": sorted(scores), "histogram": _histogram(scores, maximum),
            "exercises": per_ex, "torch_mismatch": mismatch}
    return {"submissions": len(graded), "learners": len({g.learner for g in graded}),
            "ungraded": [{"name": g.name, "learner": g.learner, "error": g.result.error}
                         for g in graded if not g.result.exercises],
            "labs": labs}


def histogram_png(lab: str, lab_summary: dict) -> bytes:
    """A PNG bar chart of one lab's ``histogram`` from :func:`class_summary` (matplotlib's Agg
    canvas, no pyplot state; no timestamp, so equal inputs give equal bytes)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    edges, counts = lab_summary["histogram"]["edges"], lab_summary["histogram"]["counts"]
    fig = Figure(figsize=(6, 2.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    widths = [b - a for a, b in zip(edges, edges[1:])]
    ax.bar(edges[:-1], counts, width=widths, align="edge", color="#4c78a8", edgecolor="white")
    ax.set_xlim(edges[0], edges[-1])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(f"score (points out of {num(lab_summary['max_score'])})")
    ax.set_ylabel("submissions")
    ax.set_title(f"{lab}: {lab_summary['submissions']} submission(s)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def summary_html(graded: list[Graded]) -> str:
    """The class summary (:func:`class_summary`) as one self-contained HTML page: per lab, the
    score statistics over the whole lab and over what could run, a histogram of lab scores
    (an embedded base64 PNG, for a lab with at least :data:`HISTOGRAM_MIN_SUBMISSIONS`
    submissions), per-exercise statistics, and one row per submission linking to
    its feedback at ``feedback/<name>.html`` (the layout :func:`write_reports` writes). Means
    and medians are shown with at most 1 decimal (the JSON of :func:`class_summary` keeps 4);
    every table sits in a container that scrolls sideways should it not fit the page's column.
    Raises ValueError for an empty list."""
    summary = class_summary(graded)
    images = {lab: base64.b64encode(histogram_png(lab, s)).decode("ascii")
              for lab, s in summary["labs"].items()
              if s["submissions"] >= HISTOGRAM_MIN_SUBMISSIONS}
    return HTML.get_template("summary.html").render(
        summary=summary, images=images, graded=graded, statuses=STATUSES, mark=CAVEAT_MARK)

