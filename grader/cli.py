"""Command line: ``grader release [--check]`` and ``grader grade PATH... --out DIR``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from grader import __version__
from grader.errors import GraderError
from grader.report import STYLE, print_result, safe, summary_table

DEFAULT_OUT = Path("build/grades")


def cmd_release(args, console: Console) -> int:
    from grader.release import release

    written = release(args.root, check=args.check)
    if args.check:
        console.print("notebooks/ is up to date with solutions/")
    for p in written:
        console.print(f"wrote {p}")
    return 0


def cmd_grade(args, console: Console) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from grader.batch import find_submissions, grade_all
    from grader.exports import load_graded, write_reports
    from grader.grade import new_seed, resolve_device

    device = resolve_device(args.device)
    seed = new_seed() if args.seed is None else args.seed
    subs = find_submissions(args.paths)
    console.print(f"grading {len(subs)} notebook(s) on {device}, seed {seed}, "
                  f"{args.jobs} job(s) -> {safe(str(args.out))}")

    def progress(o):
        console.print(f"  [{STYLE[o.status]}]{o.status:>7}[/] {o.exercise} "
                      f"[dim]({o.duration_s:.1f} s)[/dim]")

    done = {}
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                   disable=len(subs) == 1)
    with bar:
        task = bar.add_task("grading", total=len(subs))
        for sub, result, reused in grade_all(
                subs, args.out, device=device, seed=seed, timeout=args.timeout, jobs=args.jobs,
                force=args.force, same_seed=args.seed is not None,
                on_outcome=progress if len(subs) == 1 else None):
            done[sub] = (result, reused)
            bar.advance(task)
            if len(subs) > 1:
                if result.error:
                    line = f"  [red]not graded[/] {safe(sub.path)}: {safe(result.error)}"
                else:
                    line = (f"  {'reused' if reused else 'graded'} {safe(str(sub.path))}: "
                            f"{result.score:g}/{result.max_score:g}")
                bar.console.print(line, highlight=False)
    results = [(sub, *done[sub]) for sub in subs]  # a fixed order, whatever the completion order
    if len(subs) == 1:
        print_result(results[0][1], console)
    else:
        console.print(summary_table(results))
    # The reports cover every result in the folder, so regrading one learner keeps the class.
    graded = []
    for path in sorted(args.out.glob("*.json")):
        try:
            graded.append(load_graded(path))
        except (OSError, ValueError, KeyError, TypeError):
            console.print(f"[yellow]not a result, left out of the reports:[/yellow] "
                          f"{safe(str(path))}")
    try:
        write_reports(sorted(graded, key=lambda g: (g.learner, g.result.lab)), args.out)
    except ValueError as exc:  # e.g. two results for one learner and lab
        console.print(f"[red]reports not written:[/red] {safe(str(exc))}")
        return 1
    console.print(f"[dim]results: {safe(args.out)}/<name>.json; reports for the {len(graded)} "
                  "results there: gradebook.csv, junit.xml, summary.html, feedback/, gradescope/[/dim]")
    below = [sub for sub, r, _ in results if args.fail_under is not None
             and 100 * r.score < args.fail_under * r.runnable_max_score]
    for sub in below:
        console.print(f"[red]below --fail-under {args.fail_under:g}%:[/red] {safe(sub.path)}")
    if any(r.error for _, r, _ in results):
        return 1
    return 3 if below else 0


def _number(kind, low, high=None, what=""):
    """An argparse type: ``kind`` within [low, high], else a clear usage error (exit 2)."""
    def parse(text: str):
        value = kind(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description="Release and grade the PyTorch "
                                     "internals labs.")
    parser.add_argument("--version", action="version", version=f"grader {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    rel = sub.add_parser("release", help="regenerate notebooks/ from solutions/")
    rel.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 naming each notebook that is out of date")
    rel.add_argument("--root", type=Path, default=Path("."), help="course root (default: .)")
    rel.set_defaults(func=cmd_release)

    grade = sub.add_parser("grade", help="grade notebooks (files or folders of .ipynb)")
    grade.add_argument("paths", nargs="+", metavar="PATH")
    grade.add_argument("--out", type=Path, default=DEFAULT_OUT,
                       help=f"folder for <stem>.json results (default: {DEFAULT_OUT})")
    grade.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    grade.add_argument("--seed", type=int, default=None,
                       help="seed for the hidden checks (default: a fresh random one, reported)")
    grade.add_argument("--timeout", type=_number(float, 1, what="a time limit of 1 s or more"),
                       default=None,
                       help="seconds per exercise, overriding the lab table")
    grade.add_argument("--jobs", type=_number(int, 1, what="a number of jobs (1 or more)"),
                       default=1,
                       help="notebooks graded at once, each in its own kernel (default: 1)")
    grade.add_argument("--force", action="store_true",
                       help="grade again even what is unchanged since its result in --out "
                       "(a result is reused only with the same --seed, when one is given)")
    grade.add_argument("--fail-under", type=_number(float, 0, 100, "a percentage (0 to 100)"),
                       default=None, metavar="PCT",
                       help="exit 3 when a score is below PCT%% of what could run here")
    grade.set_defaults(func=cmd_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code: 0 graded, 1 some notebook could not be graded (or
    notebooks/ is stale), 2 bad arguments, 3 a score below ``--fail-under``."""
    args = build_parser().parse_args(argv)
    console = Console(emoji=False)  # ":x:" in a learner's path is text, not an emoji
    try:
        return args.func(args, console)
    except GraderError as exc:
        Console(stderr=True, soft_wrap=True, emoji=False).print(
            f"[red]error:[/red] {safe(str(exc))}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
