"""Command line: ``grader release [--check]``, ``grader lab``, ``grader grade PATH... --out
DIR [--shard K/N]``, ``grader merge DIR... --out DIR`` (the shards' reports), ``grader timings
CPU_DIR CUDA_DIR``, ``grader compare DIR_A DIR_B`` (what differs between two gradings),
``grader dist student|gradescope OUT`` and ``grader autograde ROOT`` (what
a Gradescope autograder runs)."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from rich.console import Console

from grader import __version__
from grader.errors import GraderError
from grader.reports.console import STYLE, print_result, safe, summary_table

#: the folder under which ``--out`` defaults to one folder per use (see :func:`default_out`)
OUT_ROOT = Path("build/grades")

GRADE_EPILOG = """\
what is written in --out:
  <name>.json             the result (schema grader/result.schema.json): lab, learner, score,
                          per-exercise status, points and message, environment, notes
  <name>.executed.ipynb   the notebook as graded, with outputs
  gradebook.csv           one row per learner, one column per exercise, totals
  junit.xml               one testcase per exercise, for CI dashboards
  summary.html            the class: statistics per lab and exercise, a histogram of each
                          lab of 2 or more hand-ins
  feedback/<name>.md|html per-submission feedback for the learner
  gradescope/<name>.json  Gradescope's results.json
  The reports cover every result in --out whose notebook still exists.

naming: learners come from the path: <searched folder>/<learner>/..., or
  <learner>_<NN_lab>.ipynb in a flat folder. <name> is the notebook's stem when it starts
  with the learner's name (alice_02_autograd), else <learner>-<stem> (alice-02_autograd for
  alice/02_autograd.ipynb); a later clash gets -2, -3...

shards: --shard K/N --seed S grades every N-th notebook from the K-th (learners, names and the
  assigned lab still come from the whole batch; each shard writes shard.json); grader merge
  DIR... --out DIR then writes the reports an unsharded run writes, and exits 1 naming any
  shard whose results are missing (.github/workflows/grade-sharded.yml, slurm/grade-class.sh).

torch: the labs are written for the pinned torch release; under another one grading is
  refused (exit 2) unless --allow-torch-mismatch: then every result and report records both
  versions and marks (†) the exercises whose checks depend on behaviour of the pinned release.

exit codes: 0 graded, 1 a notebook could not be graded, 2 bad arguments (or a torch other than
  the pinned one, without --allow-torch-mismatch), 3 --fail-under
"""


def default_out(paths: list[str]) -> Path:
    """``build/grades/<folder>``: the folder graded, or the folder holding the notebook graded
    (the first PATH), so the reference solutions, a learner's work and a class's submissions
    each get their own results and reports."""
    first = Path(paths[0]).absolute()
    folder = first.parent if first.suffix == ".ipynb" else first
    return OUT_ROOT / (folder.name or "root")


def _labs(text: str) -> list[str]:
    """``--labs autograd,dispatcher`` -> the lab ids (each must exist)."""
    from grader.labs import load_lab

    labs = [lab.strip() for lab in text.split(",") if lab.strip()]
    try:
        for lab in labs:
            load_lab(lab)
    except GraderError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    if not labs:
        raise argparse.ArgumentTypeError("name at least one lab")
    return labs


def cmd_release(args, console: Console) -> int:
    from grader.release import release

    written = release(args.root, check=args.check)
    if args.check:
        console.print("notebooks/ is up to date with solutions/")
    for p in written:
        console.print(f"wrote {p}")
    return 0


def cmd_lab(args, console: Console) -> int:
    from grader.lab import launch

    console.print(f"JupyterLab on the first lab in {args.folder}/ (your copies; never "
                  "overwritten); stop it with Ctrl-C")
    launch(args.folder, args.home, args.jupyter)
    return 0  # (not reached: launch replaces this process)


def cmd_dist(args, console: Console) -> int:
    from grader import dist

    if args.kind == "student":
        files = dist.student(args.root, args.out, args.labs)
        console.print(f"wrote a learner's copy of the course in {safe(str(args.out))} "
                      f"({len(files)} files): no solution, no hidden check")
    else:
        dist.gradescope(args.root, args.out, args.labs)
        console.print(f"wrote the Gradescope autograder {safe(str(args.out))}: upload it as "
                      "the assignment's autograder (Configure Autograder, Zip file upload)")
    return 0


def cmd_autograde(args, console: Console) -> int:
    from grader.dist import autograde

    results = autograde(args.root, args.labs)
    console.print(f"{results['score']:g}/{results['extra_data']['max_score']:g} -> "
                  f"{safe(str(args.root / 'results' / 'results.json'))}")
    return 0


def cmd_grade(args, console: Console) -> int:
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    from grader.judge.batch import assigned_lab, find_submissions, grade_all, shard, write_manifest
    from grader.judge.grade import (check_torch, hand_in_digest, kernel_isolation, new_seed,
                              resolve_device)
    from grader.results import PINNED_TORCH, installed_torch, is_pinned_torch, read_verified

    check_torch(args.allow_torch_mismatch)
    if not is_pinned_torch(installed := installed_torch()):
        console.print(f"[yellow]torch {safe(installed)}, not the pinned {PINNED_TORCH}: grading "
                      "anyway (--allow-torch-mismatch); the exercises whose checks depend on "
                      f"behaviour of torch {PINNED_TORCH} are marked †[/yellow]")
    if args.shard and args.seed is None:
        raise GraderError("--shard needs --seed: every shard of a batch must grade with the same "
                          "seed (e.g. the CI run's id), so that the merged reports are those of "
                          "one run")
    device = resolve_device(args.device)
    seed = new_seed() if args.seed is None else args.seed
    subs = find_submissions(args.paths)
    args.out = args.out or default_out(args.paths)
    assigned = assigned_lab(subs, args.labs)  # (of the whole batch, as are the result names)
    share = ""
    if args.shard:
        k, n = args.shard
        total = len(subs)
        share = f" (shard {k}/{n} of {total})"
        write_manifest(args.out, k, n, seed, subs)
        if not (subs := shard(subs, k, n)):
            console.print(f"shard {k}/{n} of these {total} notebook(s) is empty: nothing to "
                          "grade")
            return 0
    console.print(f"grading {len(subs)} notebook(s){share} on {device}, seed {seed}, "
                  f"{min(args.jobs, len(subs))} job(s) -> {safe(str(args.out))}")
    console.print(f"[dim]isolation: {kernel_isolation().words}[/dim]", highlight=False)
    before = {sub: hand_in_digest(sub.path) for sub in subs}
    for sub in subs:
        if (path := args.out / f"{sub.name}.json").is_file() and read_verified(path) is None:
            console.print(f"[yellow]{safe(path.name)} is not as the grader wrote it (its digest "
                          "does not verify): graded again[/yellow]")

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
                force=args.force, same_seed=args.seed is not None, assigned=assigned,
                allow_torch_mismatch=args.allow_torch_mismatch,
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
    changed = [sub for sub in subs if hand_in_digest(sub.path) != before[sub]]
    for sub in changed:
        console.print(f"[red]changed while the batch ran:[/red] {safe(sub.path)} (graded as it "
                      "was when its grading started; look at who could write it)")
    if reused := [r for _, r, again in results if again and r.environment.seed != seed]:
        console.print(f"[dim]{len(reused)} unchanged result(s) were reused: each keeps the seed "
                      "it was graded with (--force grades them again)[/dim]")
    if len(subs) == 1:
        print_result(results[0][1], console)
    else:
        console.print(summary_table(results, expand=console.is_terminal))
    if not _write_reports(_results_to_report(args, console), args.out, args.labs, console):
        return 1
    below = [sub for sub, r, _ in results if args.fail_under is not None
             and 100 * r.score < args.fail_under * r.runnable_max_score]
    for sub in below:
        console.print(f"[red]below --fail-under {args.fail_under:g}%:[/red] {safe(sub.path)}")
    if changed or any(r.error for _, r, _ in results):
        return 1
    return 3 if below else 0


def _write_reports(graded: list, out: Path, labs: list[str] | None, console: Console) -> bool:
    """Write the reports for ``graded`` in ``out`` (each learner's maximum over ``labs``, when
    given: ``--labs``) and say so; False, saying why, when they cannot be written."""
    from grader.reports import write_reports
    from grader.labs import load_lab

    assigned_max = {lab: load_lab(lab).max_score for lab in labs} if labs else None
    try:
        write_reports(graded, out, assigned_max)
    except ValueError as exc:  # e.g. two results for one learner and lab
        console.print(f"[red]reports not written:[/red] {safe(str(exc))}")
        return False
    console.print(f"[dim]results: {safe(out)}/<name>.json; reports for {len(graded)} "
                  "result(s) there: gradebook.csv, junit.xml, summary.html, feedback/, "
                  "gradescope/[/dim]")
    return True


def cmd_merge(args, console: Console) -> int:
    from grader.judge.batch import Submission, merge_shards, missing_from_shards
    from grader.reports.graded import load_graded

    names, refused = merge_shards(args.dirs, args.out)
    for path in refused:
        console.print(f"[red]refused {safe(path)}: its digest does not verify, so the grader did "
                      "not write it as it is (grade that notebook again)[/red]")
    console.print(f"merged {len(names)} result(s) from {len(args.dirs)} folder(s) -> "
                  f"{safe(str(args.out))}")
    graded = sorted((load_graded(args.out / f"{name}.json") for name in names),
                    key=lambda g: (g.learner, g.result.lab))
    console.print(summary_table([(Submission(Path(g.result.notebook), g.learner, g.name),
                                  g.result, False) for g in graded], expand=console.is_terminal))
    if len(seeds := sorted({g.result.environment.seed for g in graded})) > 1:
        console.print(f"[yellow]these results were graded with {len(seeds)} seeds ("
                      f"{', '.join(map(str, seeds[:5]))}): the shards of one run share one; "
                      "is a shard from another run?[/yellow]")
    if not _write_reports(_results_to_report(args, console), args.out, args.labs, console):
        return 1
    if missing := missing_from_shards(args.dirs, set(names)):
        console.print("[red]incomplete: these reports lack what the shards' manifests "
                      "(shard.json) promise[/red]")
        for line in missing:
            console.print(f"  [red]{safe(line)}[/red]")
        return 1
    if errors := [g for g in graded if g.result.error]:
        console.print(f"[red]{len(errors)} notebook(s) could not be graded (each scores 0 in "
                      "the reports; fix or re-collect it and grade it again):[/red]")
        for g in errors:
            console.print(f"  [red]{safe(g.name)}: {safe(g.result.error)}[/red]")
    return 1 if refused or errors else 0


def cmd_compare(args, console: Console) -> int:
    from grader.reports.console import differences_table

    a, b = _results_by_lab(args.dir_a), _results_by_lab(args.dir_b)
    if (table := differences_table(a, b)) is None:
        console.print(f"no exercise differs: {sum(len(r.exercises) for r in a.values())} "
                      f"exercise(s) of {len(a)} lab(s) have the same status and points")
        return 0
    console.print(table)
    return 1


def cmd_timings(args, console: Console) -> int:
    from grader.reports.console import timings_table

    by_lab = [_results_by_lab(folder) for folder in (args.cpu_dir, args.cuda_dir)]
    console.print(timings_table(*by_lab))
    return 0


def _results_by_lab(folder: Path) -> dict:
    """lab id -> the one result of that lab in ``folder`` (GraderError when the folder is
    missing, holds no result, or holds two of one lab)."""
    from grader.reports.graded import load_graded

    if not folder.is_dir():
        raise GraderError(f"{folder}: no such folder (give the --out folder of a grading)")
    found = {}
    for path in sorted(folder.glob("*.json")):
        try:
            result = load_graded(path).result
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a result
        if result.lab in found:
            raise GraderError(f"{folder}: two results of lab {result.lab}; give a folder that "
                              "holds one grading of each lab (e.g. of solutions/)")
        found[result.lab] = result
    if not found:
        raise GraderError(f"{folder}: no results (give the --out folder of a grading)")
    return found


def _results_to_report(args, console: Console) -> list:
    """The results in ``--out`` the reports cover, sorted by learner and lab: every result there
    (so grading one late learner into the class's folder keeps the class), except a result
    whose notebook no longer exists (a deleted or renamed hand-in: unless ``--keep-missing``),
    which is named on the console, and a result the grader did not write as it is (its
    digest does not verify: :func:`grader.results.read_verified`), also named; a shard's
    manifest is no result."""
    from grader.judge.batch import SHARD_MANIFEST
    from grader.reports.graded import load_graded
    from grader.results import read_verified

    graded = []
    for path in sorted(args.out.glob("*.json")):
        if path.name == SHARD_MANIFEST:
            continue
        try:
            g = load_graded(path)
        except (OSError, ValueError, KeyError, TypeError):
            console.print(f"[yellow]not a result, left out of the reports:[/yellow] "
                          f"{safe(str(path))}")
            continue
        if read_verified(path) is None:
            console.print(f"[yellow]not written by the grader as it is (its digest does not "
                          f"verify), left out of the reports:[/yellow] {safe(path.name)} "
                          "(grade its notebook again)")
            continue
        if not args.keep_missing and not Path(g.result.notebook).exists():
            console.print(f"[yellow]submission gone, its result left out of the reports:"
                          f"[/yellow] {safe(path.name)} (graded from {safe(g.result.notebook)}, "
                          "which no longer exists; --keep-missing counts it)")
            continue
        graded.append(g)
    return sorted(graded, key=lambda g: (g.learner, g.result.lab))


def _shard(text: str) -> tuple[int, int]:
    """``--shard 2/3`` -> (2, 3); a usage error unless 1 <= K <= N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise argparse.ArgumentTypeError(f"{text} is not K/N with 1 <= K <= N (e.g. 2/3)")
    return int(k), int(n)


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

    lab = sub.add_parser("lab", help="open JupyterLab on the first lab, with the course's "
                         "kernel and settings",
                         epilog="Any other option is jupyter lab's own, and goes to it: e.g. "
                         "--port 8890 --no-browser --ip 0.0.0.0 "
                         "--IdentityProvider.token=SECRET.")
    lab.add_argument("folder", nargs="?", type=Path, default=Path("work"),
                     help="where your copies of the released notebooks are, or go (default: "
                     "work)")
    lab.add_argument("--home", type=Path, default=Path("build/jupyter"),
                     help="where the course's kernelspec and JupyterLab settings are written "
                     "(default: build/jupyter)")
    lab.set_defaults(func=cmd_lab)

    grade = sub.add_parser("grade", help="grade notebooks (files or folders of .ipynb)",
                           epilog=GRADE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    grade.add_argument("paths", nargs="+", metavar="PATH",
                       help="notebooks, or folders searched recursively for them")
    grade.add_argument("--out", type=Path, default=None,
                       help=f"folder for the results and reports (default: {OUT_ROOT}/<the "
                       "folder graded, or the folder of the notebook graded>)")
    grade.add_argument("--labs", type=_labs, default=None, metavar="LAB[,LAB...]",
                       help="the labs the class was assigned: each learner's maximum is over "
                       "these labs, and results of other labs count for nothing (default: the "
                       "labs among the results); a notebook that does not say its lab is "
                       "graded as the only one, if one")
    grade.add_argument("--device", default="auto", help="auto, cpu or cuda (default: auto)")
    grade.add_argument("--seed", type=int, default=None,
                       help="seed for the hidden checks (default: a fresh random one, reported)")
    grade.add_argument("--timeout", type=_number(float, 1, what="a time limit of 1 s or more"),
                       default=None,
                       help="seconds per exercise, overriding the lab table")
    grade.add_argument("--jobs", type=_number(int, 1, what="a number of jobs (1 or more)"),
                       default=os.cpu_count() or 1,
                       help="notebooks graded at once, each in its own kernel (default: the "
                       f"number of CPU cores, {os.cpu_count() or 1} here)")
    grade.add_argument("--force", action="store_true",
                       help="grade again even what is unchanged since its result in --out "
                       "(a result is reused only with the same --seed, when one is given)")
    grade.add_argument("--keep-missing", action="store_true",
                       help="count results in --out whose notebook no longer exists (a deleted "
                       "or renamed hand-in); by default they are named and left out")
    grade.add_argument("--fail-under", type=_number(float, 0, 100, "a percentage (0 to 100)"),
                       default=None, metavar="PCT",
                       help="exit 3 when a score is below PCT%% of what could run here")
    grade.add_argument("--shard", type=_shard, default=None, metavar="K/N",
                       help="grade only shard K of N of the notebooks found (every N-th from "
                       "the K-th; needs --seed), e.g. one job of a CI matrix or a Slurm job "
                       "array; grader merge then writes the class's reports")
    grade.add_argument("--allow-torch-mismatch", action="store_true",
                       help="grade under a torch other than the pinned release (by default "
                       "refused): the results record both versions and mark the exercises "
                       "whose checks depend on behaviour of the pinned release")
    grade.set_defaults(func=cmd_grade)

    merge = sub.add_parser("merge", help="merge the --out folders of the shards of a batch "
                           "(grader grade --shard K/N) into one, and write its reports",
                           description="Copy every result (with its executed notebook) of the "
                           "folders DIR into --out, then write the reports of every result "
                           "there, as an unsharded run of the batch writes them; exit 1 when a "
                           "shard's results are missing (the shards' shard.json say which "
                           "they owe), when a result's digest does not verify, or when a "
                           "notebook could not be graded (an unreadable one): each is named.")
    merge.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                       help="the --out folders of the shards")
    merge.add_argument("--out", type=Path, required=True,
                       help="folder for the merged results and reports")
    merge.add_argument("--labs", type=_labs, default=None, metavar="LAB[,LAB...]",
                       help="the labs the class was assigned, as given to grader grade")
    merge.add_argument("--keep-missing", action="store_true",
                       help="count results whose notebook no longer exists (as grader grade "
                       "--keep-missing)")
    merge.set_defaults(func=cmd_merge)

    timings = sub.add_parser("timings", help="a table per lab of the seconds and scores of two "
                             "result folders, graded on CPU and on CUDA")
    timings.add_argument("cpu_dir", type=Path, metavar="CPU_DIR",
                         help="the --out folder of a grading on the CPU")
    timings.add_argument("cuda_dir", type=Path, metavar="CUDA_DIR",
                         help="the --out folder of the same notebooks graded with --device cuda")
    timings.set_defaults(func=cmd_timings)

    compare = sub.add_parser("compare", help="the exercises whose status or points differ "
                             "between two gradings of the same notebooks (e.g. under two torch "
                             "releases: make other-torch); exit 1 when any does",
                             description="Put two gradings of the same notebooks side by side "
                             "(each the --out folder of grader grade, holding one result per "
                             "lab, e.g. of solutions/) and list every exercise whose status or "
                             "points differ, with the first line of the message of the side "
                             "that did worse; exit 0 when none does, 1 when some do.")
    compare.add_argument("dir_a", type=Path, metavar="DIR_A",
                         help="the --out folder of one grading")
    compare.add_argument("dir_b", type=Path, metavar="DIR_B",
                         help="the --out folder of the other grading")
    compare.set_defaults(func=cmd_compare)

    dist = sub.add_parser("dist", help="write a copy of the course for a class: a learner's "
                          "(no solution, no hidden check) or a Gradescope autograder")
    dist.add_argument("kind", choices=["student", "gradescope"],
                      help="student: a folder for learners (the released notebooks, public "
                      "checks, self-check, README, Makefile, GitHub Classroom workflow); "
                      "gradescope: an autograder .zip (setup.sh, run_autograder, every check)")
    dist.add_argument("out", type=Path, metavar="OUT",
                      help="a new (or empty) folder for student, a .zip file for gradescope")
    dist.add_argument("--labs", type=_labs, default=None, metavar="LAB[,LAB...]",
                      help="only these labs (default: every lab): the learner's copy has their "
                      "notebooks and Classroom tests; the autograder grades their notebooks and "
                      "scores a missing one 0")
    dist.add_argument("--root", type=Path, default=Path("."), help="course root (default: .)")
    dist.set_defaults(func=cmd_dist)

    auto = sub.add_parser("autograde", help="grade a Gradescope submission: ROOT/submission -> "
                          "ROOT/results/results.json (what the autograder's run_autograder runs)")
    auto.add_argument("root", type=Path, nargs="?", default=Path("/autograder"), metavar="ROOT",
                      help="Gradescope's folder (default: /autograder)")
    auto.add_argument("--labs", type=_labs, default=None, metavar="LAB[,LAB...]",
                      help="the assignment's labs: notebooks of others are not graded, and a "
                      "lab without a notebook scores 0 (default: any lab)")
    auto.set_defaults(func=cmd_autograde)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code: 0 graded, 1 some notebook could not be graded (or
    notebooks/ is stale), 2 bad arguments, 3 a score below ``--fail-under``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "func", None) is cmd_lab:  # the rest is jupyter lab's (--port, ...)
        args.jupyter = [a for a in extra if a != "--"]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    console = make_console()
    try:
        return args.func(args, console)
    except GraderError as exc:
        make_console(stderr=True).print(f"[red]error:[/red] {safe(str(exc))}", soft_wrap=True)
        return exc.exit_code


def make_console(stderr: bool = False) -> Console:
    """The CLI's console: ``:x:`` in a learner's path is text, not an emoji; into a file or a
    pipe, lines are written whole (never wrapped mid-word, paths never cut), and tables fit
    ``COLUMNS`` columns, or 100 (a log file's reader has no terminal to size them by)."""
    console = Console(emoji=False, stderr=stderr)
    if console.is_terminal:
        return console
    width = shutil.get_terminal_size((100, 24)).columns
    return Console(emoji=False, stderr=stderr, soft_wrap=True, width=width)


if __name__ == "__main__":
    sys.exit(main())
