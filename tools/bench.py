"""``make bench``: how long grading takes on this machine, against plain papermill, and how a
batch scales with ``--jobs`` (README, "Performance").

Four measurements, each repeated (``--repeat``, default 3) and reported as the median with its
spread (min to max); what is compared is measured side by side, alternating which goes first:

- **per lab:** ``papermill`` (its CLI, the ``python3`` kernel) on the lab's solution notebook,
  then ``grader grade`` on the same notebook (one job; hidden checks included), and the ratio of
  the two wall times, taken pair by pair. Both kernels start from a copy of the same warm
  Inductor cache (the one the grader keeps: :func:`grader.judge.sandbox.warm_cache`).
- **course:** ``grader grade solutions/`` (the labs chosen) with ``--jobs 1`` and ``--jobs 2``;
  the course's target (all six labs in 6 minutes) is judged only when every lab is chosen.
- **batch:** ``--batch`` learners (default 12), each handing in the ``--batch-lab`` solution
  (default ``autograd``; its metadata made their own, so none is the reference), graded with
  ``--jobs 1`` and ``--jobs 2``, and the speed-up.
- **the machine's ceiling:** just before the batch, a CPU-bound loop of plain Python run alone,
  then two copies at once: ``2 × alone / together`` is how much of two whole cores the machine
  gave (2.0: all of it; less where others share its CPUs), the most any ``--jobs 2`` can gain.

Peak memory: the largest resident set (RSS) of a grader process and of a kernel, sampled every
0.1 s (psutil) over every run. First, one untimed ``grader grade`` of the labs' solutions warms
the caches (the grader's Inductor cache, the files' pages). Everything lands in
``build/bench/bench.json``; the tables are printed.

    python tools/bench.py [--repeat N] [--labs LAB,...] [--batch N] [--batch-lab LAB] [--out D]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grader.cli import make_console  # noqa: E402
from grader.judge.grade import warm_cache_dir  # noqa: E402
from grader.labs import lab_ids, load_lab  # noqa: E402
from grader.results import installed_torch  # noqa: E402

#: the targets of the course's performance issue (README, "Performance"), on 2 CPU cores
TARGETS = {"ratio": 1.10, "speedup": 1.7, "course_s": 360.0}
#: seconds between two samples of the processes' memory
SAMPLE_S = 0.1
#: a CPU-bound loop of plain Python, 1.4 s to 2.4 s on one core here: the 2-core scaling
SPIN = "x = 0\nfor i in range(25_000_000):\n    x += i"


def measure(argv: list[str], env: dict | None = None, cwd: Path | None = None) -> dict:
    """Run ``argv`` to its end: ``wall_s`` (seconds), ``rc``, and the peak RSS in MiB of the
    largest kernel (a process running ``ipykernel``) and of the largest other process of the
    tree that is not a kernel's descendant (the grader, its workers). RuntimeError when the
    command fails (exit status above 1: 1 is a notebook not graded, which the scores show)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    peak = {"grader": 0, "kernel": 0}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            _sample(root, peak)
        except psutil.Error:
            pass
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - start
    output = proc.stdout.read()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}:\n{output[-3000:]}")
    return {"wall_s": round(wall, 3), "rc": proc.returncode,
            "grader_rss_mib": round(peak["grader"] / 2**20, 1),
            "kernel_rss_mib": round(peak["kernel"] / 2**20, 1)}


def _sample(root: psutil.Process, peak: dict) -> None:
    """Raise ``peak``'s grader and kernel RSS (bytes) to what the tree under ``root`` uses
    now."""
    kernels: set[int] = set()
    tree = [root, *root.children(recursive=True)]
    for p in tree:
        try:
            if any("ipykernel" in part for part in p.cmdline()):
                kernels.add(p.pid)
                peak["kernel"] = max(peak["kernel"], p.memory_info().rss)
        except psutil.Error:
            continue
    for p in tree:
        try:
            if p.pid in kernels or any(a.pid in kernels for a in p.parents()):
                continue
            peak["grader"] = max(peak["grader"], p.memory_info().rss)
        except psutil.Error:
            continue


def spread(values: list[float]) -> dict:
    """``median``, ``min``, ``max`` (rounded to ms) and the ``runs`` themselves."""
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "runs": [round(v, 3) for v in values]}


def _fmt(s: dict, unit: str = "s") -> str:
    return f"{s['median']:.2f} {unit} ({s['min']:.2f}–{s['max']:.2f})"


class Bench:
    """The measurements of one ``make bench``, in a scratch folder."""

    def __init__(self, repeat: int, scratch: Path, console: Console):
        self.repeat, self.scratch, self.console = repeat, scratch, console
        self.started = time.monotonic()
        self.memory = {"grader": 0.0, "kernel": 0.0}

    def say(self, text: str) -> None:
        self.console.print(f"[dim]{time.monotonic() - self.started:7.1f} s[/dim] {text}")

    def run(self, argv: list[str], env: dict | None = None) -> dict:
        m = measure(argv, env=env, cwd=ROOT)
        self.memory["grader"] = max(self.memory["grader"], m["grader_rss_mib"])
        self.memory["kernel"] = max(self.memory["kernel"], m["kernel_rss_mib"])
        return m

    def grade(self, paths: list[Path], jobs: int) -> dict:
        out = Path(tempfile.mkdtemp(dir=self.scratch, prefix="grades-"))
        return self.run([sys.executable, "-m", "grader", "grade", *map(str, paths), "--out",
                         str(out), "--force", "--jobs", str(jobs), "--seed", "1"])

    def papermill(self, lab) -> dict:
        nb = lab.root / "solutions" / f"{lab.notebook}.ipynb"
        run = Path(tempfile.mkdtemp(dir=self.scratch, prefix="papermill-"))
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(run / "torchinductor"))
        if (warm := warm_cache_dir(lab)).is_dir():  # the warm cache the grader's kernel copies
            shutil.copytree(warm, run / "torchinductor", symlinks=True)
        (run / "work").mkdir()
        return self.run([sys.executable, "-m", "papermill", str(nb), str(run / "out.ipynb"),
                         "-k", "python3", "--cwd", str(run / "work"), "--no-progress-bar",
                         "--log-level", "ERROR"], env=env)

    def side_by_side(self, name: str, a, b) -> tuple[list[dict], list[dict]]:
        """``repeat`` runs of ``a`` and of ``b`` (callables), in turns: a b, b a, a b..."""
        ra, rb = [], []
        for i in range(self.repeat):
            for which in ((a, ra), (b, rb)) if i % 2 == 0 else ((b, rb), (a, ra)):
                which[1].append(which[0]())
            self.say(f"{name} {i + 1}/{self.repeat}: {ra[-1]['wall_s']:.1f} s, "
                     f"{rb[-1]['wall_s']:.1f} s")
        return ra, rb


def per_lab(bench: Bench, labs: list) -> dict:
    out = {}
    for lab in labs:
        nb = lab.root / "solutions" / f"{lab.notebook}.ipynb"
        pm, gr = bench.side_by_side(lab.id, lambda: bench.papermill(lab),
                                    lambda: bench.grade([nb], 1))
        out[lab.id] = {
            "papermill_s": spread([m["wall_s"] for m in pm]),
            "grader_s": spread([m["wall_s"] for m in gr]),
            "ratio": spread([g["wall_s"] / p["wall_s"] for p, g in zip(pm, gr)]),
            "grader_rss_mib": max(m["grader_rss_mib"] for m in gr),
            "kernel_rss_mib": max(m["kernel_rss_mib"] for m in gr)}
    return out


def jobs_1_and_2(bench: Bench, name: str, paths: list[Path]) -> dict:
    one, two = bench.side_by_side(name, lambda: bench.grade(paths, 1),
                                  lambda: bench.grade(paths, 2))
    return {"notebooks": len(paths) if paths[0].suffix else len(list(paths[0].rglob("*.ipynb"))),
            "jobs_1_s": spread([m["wall_s"] for m in one]),
            "jobs_2_s": spread([m["wall_s"] for m in two]),
            "speedup": spread([a["wall_s"] / b["wall_s"] for a, b in zip(one, two)]),
            "grader_rss_mib": max(m["grader_rss_mib"] for m in one + two),
            "kernel_rss_mib": max(m["kernel_rss_mib"] for m in one + two)}


def cpu_scaling(bench: Bench) -> dict:
    """``repeat`` rounds of: one :data:`SPIN` alone, then two at once (wall seconds); the
    ``ceiling`` is ``2 × alone / together`` per round (2.0 when the machine gives two whole
    cores; no ``--jobs 2`` speed-up can beat it)."""
    def wall(copies: int) -> float:
        start = time.monotonic()
        procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(copies)]
        if any(p.wait() for p in procs):
            raise RuntimeError("the CPU-bound loop failed")
        return time.monotonic() - start
    alone, together = [], []
    for i in range(bench.repeat):
        alone.append(wall(1))
        together.append(wall(2))
        bench.say(f"cpu scaling {i + 1}/{bench.repeat}: {alone[-1]:.2f} s alone, "
                  f"{together[-1]:.2f} s two at once")
    return {"alone_s": spread(alone), "together_s": spread(together),
            "ceiling": spread([2 * a / t for a, t in zip(alone, together)])}


def make_batch(folder: Path, lab, learners: int) -> Path:
    """``learners`` folders ``learnerNN/`` under ``folder``, each with ``lab``'s solution as
    that learner's hand-in (its metadata says whose, so none is byte for byte the
    reference)."""
    solution = nbformat.read(lab.root / "solutions" / f"{lab.notebook}.ipynb", as_version=4)
    for i in range(1, learners + 1):
        solution.metadata["learner"] = f"learner{i:02d}"
        (folder / f"learner{i:02d}").mkdir(parents=True)
        nbformat.write(solution, folder / f"learner{i:02d}" / f"{lab.notebook}.ipynb")
    return folder


def tables(results: dict) -> list[Table]:
    """The printed tables of ``results`` (bench.json's content)."""
    t = Table(title=f"per lab: plain papermill vs grader grade (median of "
                    f"{results['repeat']}, min–max)")
    for col in ("lab", "papermill", "grader", "grader / papermill", "target",
                "grader RSS", "kernel RSS"):
        t.add_column(col, justify="left" if col == "lab" else "right")
    for lab, r in results["labs"].items():
        ok = r["ratio"]["median"] <= TARGETS["ratio"]
        t.add_row(lab, _fmt(r["papermill_s"]), _fmt(r["grader_s"]), _fmt(r["ratio"], "×"),
                  f"≤ {TARGETS['ratio']:.2f} {'met' if ok else 'MISSED'}",
                  f"{r['grader_rss_mib']:.0f} MiB", f"{r['kernel_rss_mib']:.0f} MiB")
    out = [t]
    course = ("the course's solutions" if results["whole_course"] else
              f"the solutions of {results['course']['notebooks']} lab(s) (--labs)")
    for key, title in (("course", course),
                       ("batch", f"a batch of {results['batch']['notebooks']} hand-ins of "
                                 f"{results['batch_lab']}")):
        r = results[key]
        u = Table(title=f"{title}: --jobs 1 vs --jobs 2")
        for col in ("notebooks", "--jobs 1", "--jobs 2", "speed-up", "grader RSS",
                    "kernel RSS"):
            u.add_column(col, justify="right")
        u.add_row(str(r["notebooks"]), _fmt(r["jobs_1_s"]), _fmt(r["jobs_2_s"]),
                  _fmt(r["speedup"], "×"), f"{r['grader_rss_mib']:.0f} MiB",
                  f"{r['kernel_rss_mib']:.0f} MiB")
        out.append(u)
    return out


def verdicts(results: dict) -> list[str]:
    """One line per target: met or missed, with its figure."""
    lines = [f"grader/papermill ≤ {TARGETS['ratio']:.2f} on every lab: "
             + ("met" if all(r["ratio"]["median"] <= TARGETS["ratio"]
                             for r in results["labs"].values()) else "MISSED")
             + " (" + ", ".join(f"{lab} {r['ratio']['median']:.2f}"
                                for lab, r in results["labs"].items()) + ")"]
    speedup = results["batch"]["speedup"]["median"]
    ceiling = results["cpu_scaling"]["ceiling"]["median"]
    lines.append(f"--jobs 2 ≥ {TARGETS['speedup']}× faster than --jobs 1 on the batch: "
                 f"{'met' if speedup >= TARGETS['speedup'] else 'MISSED'} ({speedup:.2f}×; "
                 f"this machine ran two CPU-bound loops at once {ceiling:.2f}× as fast as one)")
    course = results["course"]["jobs_2_s"]["median"]
    verdict = (("met" if course <= TARGETS["course_s"] else "MISSED") if results["whole_course"]
               else f"not judged: --labs chose {results['course']['notebooks']} of the labs")
    lines.append(f"the course graded in ≤ {TARGETS['course_s']:.0f} s (warm caches, --jobs 2): "
                 f"{verdict} ({course:.0f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/bench.py", description=" ".join(
        __doc__.split("\n\n")[0].split()))
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (default 3)")
    parser.add_argument("--labs", default=",".join(lab_ids()),
                        help="the labs measured (default: all)")
    parser.add_argument("--batch", type=int, default=12, help="hand-ins in the batch (12)")
    parser.add_argument("--batch-lab", default="autograd", help="the batch's lab (autograd)")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "bench",
                        help="where bench.json goes (default: build/bench)")
    args = parser.parse_args(argv)
    console = make_console()
    labs = [load_lab(lab) for lab in args.labs.split(",")]
    solutions = [lab.root / "solutions" / f"{lab.notebook}.ipynb" for lab in labs]
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        bench = Bench(args.repeat, Path(scratch), console)
        bench.say(f"warming the caches: grading {len(labs)} solution(s) once")
        bench.grade(solutions, 2)
        results = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "torch": installed_torch(), "platform": platform.platform(),
                        "date": time.strftime("%Y-%m-%d")},
            "repeat": args.repeat, "targets": TARGETS, "batch_lab": args.batch_lab,
            "whole_course": {lab.id for lab in labs} == set(lab_ids()),
            "labs": per_lab(bench, labs),
            "course": jobs_1_and_2(bench, "course", solutions),
            "cpu_scaling": cpu_scaling(bench),
            "batch": jobs_1_and_2(bench, "batch", [make_batch(
                Path(scratch) / "batch", load_lab(args.batch_lab), args.batch)]),
            "peak_rss_mib": bench.memory,
            "bench_s": round(time.monotonic() - bench.started, 1)}
    (args.out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    for table in tables(results):
        console.print(table)
    for line in verdicts(results):
        console.print(line)
    console.print(f"[dim]{args.out / 'bench.json'} ({results['bench_s']:.0f} s)[/dim]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
