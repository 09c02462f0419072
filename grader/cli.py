"""Command line: ``grader release [--check]`` and ``grader grade PATH... --out DIR``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from grader import __version__
from grader.errors import GraderError

DEFAULT_OUT = Path("build/grades")


def _notebooks(paths: list[str]) -> list[Path]:
    """The notebooks named, and those under the folders named (recursively, skipping hidden
    folders such as .ipynb_checkpoints and the grader's own *.executed.ipynb)."""
    found = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(q for q in p.rglob("*.ipynb")
                            if not q.name.endswith(".executed.ipynb")
                            and not any(part.startswith(".") for part in q.relative_to(p).parts))
        elif p.is_file():
            found.append(p)
        else:
            raise GraderError(f"{p}: no such file or folder")
    if not found:
        raise GraderError(f"no notebooks found in {', '.join(paths)}")
    return found


def result_names(paths: list[Path]) -> list[str]:
    """One result name per notebook: its stem, or ``<folder>-<stem>`` where stems collide
    (``alice/02_autograd.ipynb``, ``bob/02_autograd.ipynb``). GraderError if still ambiguous."""
    stems = [p.stem for p in paths]
    names = [f"{p.parent.name}-{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise GraderError(f"several notebooks would write the result {dup[0]}.json; grade them "
                          "into separate --out folders")
    return names


def cmd_release(args, console: Console) -> int:
    from grader.release import release

    written = release(args.root, check=args.check)
    if args.check:
        console.print("notebooks/ is up to date with solutions/")
    for p in written:
        console.print(f"wrote {p}")
    return 0


def cmd_grade(args, console: Console) -> int:
    from grader.grade import grade_notebook, new_seed, resolve_device
    from grader.report import STYLE, print_result

    device = resolve_device(args.device)
    seed = new_seed() if args.seed is None else args.seed
    failed = 0
    paths = _notebooks(args.paths)
    for path, name in zip(paths, result_names(paths)):
        console.print(f"[bold]grading {path}[/bold] (device {device}, seed {seed})")

        def progress(o):
            console.print(f"  [{STYLE[o.status]}]{o.status:>7}[/] {o.exercise} "
                          f"[dim]({o.duration_s:.1f} s)[/dim]")

        result = grade_notebook(path, args.out, device=device, seed=seed, timeout=args.timeout,
                                name=name, on_outcome=progress)
        print_result(result, console)
        console.print(f"[dim]result: {args.out / (name + '.json')}[/dim]\n")
        failed += result.error is not None
    return 1 if failed else 0


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
    grade.add_argument("--timeout", type=float, default=None,
                       help="seconds per exercise, overriding the lab table")
    grade.set_defaults(func=cmd_grade)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 graded, 1 something could not be graded or
    notebooks/ is stale, 2 bad arguments or input)."""
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return args.func(args, console)
    except GraderError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
