"""Human-readable views of a :class:`LabResult` (pure functions of it).

Everything a submission controls (paths, learner names, messages, notes, errors) goes through
:func:`safe` before it reaches rich, whose markup would otherwise read ``[/bold]`` in a file name
or an exception message as a tag (and raise on an unmatched one), and whose console would pass
an escape sequence (clear the screen, retitle the window) on to the terminal."""
from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grader.results import CAVEAT_MARK, LabResult, mismatch_note

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: object) -> str:
    """``text`` as literal console text: rich markup escaped, control characters (ESC and the
    like, but not newline or tab) shown as ``\\x1b`` instead of sent to the terminal."""
    return escape(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text)))


STYLE = {"passed": "green", "failed": "red", "error": "red", "timeout": "yellow",
         "crashed": "magenta", "skipped": "dim"}


def table(result: LabResult) -> Table:
    """A per-exercise table with the score over the whole lab and over what could run; the
    messages of exercises that did not pass follow the table (see :func:`print_result`). Under
    a torch other than the pinned one the caption names the pinned release too, and the
    exercises with a ``version_caveat`` are marked."""
    env = result.environment
    pinned = f" (pinned {env.torch_pinned})" if env.torch_mismatch else ""
    t = Table(title=safe(f"{result.lab} — {result.notebook}"),
              caption=(f"score {result.score:g}/{result.max_score:g} "
                       f"(over what could run here: "
                       f"{result.score:g}/{result.runnable_max_score:g})"
                       f" · seed {env.seed} · {env.device} · torch {env.torch_version}{pinned}"
                       f" · {result.duration_s:.1f} s"),
              expand=True)
    t.add_column("exercise", no_wrap=True)
    t.add_column("title", ratio=1)
    t.add_column("status", no_wrap=True)
    t.add_column("points", justify="right", no_wrap=True)
    t.add_column("time", justify="right", no_wrap=True)
    for e in result.exercises:
        t.add_row(e.id + (f" {CAVEAT_MARK}" if e.version_caveat else ""), e.title,
                  f"[{STYLE[e.status]}]{e.status}[/]",
                  f"{e.points:g}/{e.max_points:g}", f"{e.duration_s:.1f} s")
    return t


def print_result(result: LabResult, console: Console) -> None:
    """Print the table, what to fix for each exercise that did not pass, any notes, the
    grading error and, under a torch other than the pinned one, what the mark means."""
    t = table(result)
    t.expand = console.is_terminal  # (into a file: the table's natural width, nothing cut)
    console.print(t)
    for e in result.exercises:
        if e.status != "passed":
            console.print(f"[{STYLE[e.status]}]{e.status}[/] [bold]{e.id}[/bold]: "
                          f"{safe(e.message)}",
                          highlight=False)
    for note in result.notes:
        console.print(f"[dim]note:[/dim] {safe(note)}", highlight=False)
    if result.error:
        console.print(f"[red]grading error:[/red] {safe(result.error)}", highlight=False)
    if result.environment.torch_mismatch:
        console.print(f"[yellow]torch:[/yellow] {safe(mismatch_note(result.environment))}",
                      highlight=False)


def summary_table(results, expand: bool = True) -> Table:
    """One row per submission of a batch: ``results`` is a list of (Submission, LabResult,
    reused) in the batch's order; ``expand``: as wide as the console."""
    t = Table(title="batch summary", expand=expand)
    for name in ("learner", "lab", "notebook", "score", "runnable", "statuses"):
        t.add_column(name, justify="right" if name in ("score", "runnable") else "left",
                     overflow="fold")  # (a narrow terminal wraps a path; it never cuts one)
    for sub, r, reused in results:
        counts = {}
        for e in r.exercises:
            counts[e.status] = counts.get(e.status, 0) + 1
        statuses = " ".join(f"[{STYLE[s]}]{counts[s]} {s}[/]" for s in STYLE if s in counts)
        if r.error:  # (its reason is printed with its name, on a line of its own)
            statuses = "[red]not graded (the reason is printed with its name)[/]"
        t.add_row(safe(sub.learner), r.lab,
                  safe(str(sub.path)) + (" [dim](reused)[/dim]" if reused else ""),
                  f"{r.score:g}/{r.max_score:g}", f"{r.score:g}/{r.runnable_max_score:g}",
                  statuses)
    return t


def timings_table(cpu: dict[str, LabResult], cuda: dict[str, LabResult]) -> Table:
    """One row per lab (results by lab id, of a grading on the CPU and one on CUDA): seconds
    on each (the whole notebook's wall time), CPU seconds over CUDA seconds, and each score over
    what could run there; ``–`` where a lab has no result on one side."""
    t = Table(title="CPU versus CUDA")
    for name in ("lab", "CPU s", "CUDA s", "CPU/CUDA", "CPU score", "CUDA score"):
        t.add_column(name, justify="left" if name == "lab" else "right")

    def seconds(r):
        return f"{r.duration_s:.1f}" if r else "–"

    def score(r):
        return f"{r.score:g}/{r.runnable_max_score:g}" if r else "–"

    for lab in sorted(cpu.keys() | cuda.keys()):
        a, b = cpu.get(lab), cuda.get(lab)
        ratio = f"{a.duration_s / b.duration_s:.2f}" if a and b and b.duration_s else "–"
        t.add_row(lab, seconds(a), seconds(b), ratio, score(a), score(b))
    return t


def differences_table(a: dict[str, LabResult], b: dict[str, LabResult]) -> Table | None:
    """The exercises whose status or points differ between two gradings of the same notebooks
    (results by lab id: e.g. the reference solutions under the pinned torch, then under
    another): one row each, with both sides' status and points and the first line of the
    message of the side that did worse. None when no exercise differs. The title names both
    sides' torch versions."""
    versions = [next((r.environment.torch_version for r in side.values()), "–")
                for side in (a, b)]
    t = Table(title=f"torch {versions[0]} versus torch {versions[1]}: what differs")
    for name in ("exercise", versions[0], versions[1], "why"):
        t.add_column(name, overflow="fold")
    for lab in sorted(a.keys() | b.keys()):
        left = {e.id: e for e in a[lab].exercises} if lab in a else {}
        right = {e.id: e for e in b[lab].exercises} if lab in b else {}
        for ex in [*left, *(e for e in right if e not in left)]:
            x, y = left.get(ex), right.get(ex)
            if x and y and (x.status, x.points) == (y.status, y.points):
                continue
            worse = y if x is None or (y is not None and y.points < x.points) else x
            t.add_row(ex, _status(x), _status(y),
                      (worse.message.splitlines() or [""])[0] if worse else "")
    return t if t.row_count else None


def _status(e) -> str:
    return f"{e.status} {e.points:g}/{e.max_points:g}" if e else "–"
