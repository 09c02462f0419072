"""Grade one submitted notebook: assemble it against the release, execute it with papermill and
the ``grader`` engine, and turn the outcomes into a :class:`LabResult` that is always written,
even when grading could not happen (then every exercise scores 0 with the reason)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import nbformat.v4 as v4
import papermill
from papermill.exceptions import PapermillExecutionError

import grader
from grader import __version__, notebook
from grader.judge.assemble import assemble
from grader.errors import GraderError
from grader.judge.execute import Outcome  # noqa: F401  (importing registers the "grader" engine)
from grader.labs import Exercise, Lab, lab_from_name, lab_ids, lab_of, load_lab
from grader.results import (PINNED_TORCH, Environment, ExerciseResult, LabResult,
                            installed_torch, is_pinned_torch)
from grader.judge.sandbox import Isolation, Limits, isolation, keep_warm_cache, warm_cache


def new_seed() -> int:
    """A fresh random seed for the hidden checks (reported in every result)."""
    return secrets.randbelow(2**31)


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``. GraderError for an unknown
    device, or ``cuda`` on a machine where torch sees no GPU. A CPU build of torch (version
    ``+cpu``) means ``cpu`` without importing torch (2 s of the grader's start)."""
    if device not in ("auto", "cpu", "cuda"):
        raise GraderError(f"unknown device {device!r}: use auto, cpu or cuda")
    if device == "cpu" or (device == "auto" and installed_torch().endswith("+cpu")):
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise GraderError("--device cuda, but torch sees no CUDA GPU here (torch "
                          f"{torch.__version__}); use --device cpu or auto")
    return "cpu"


def check_torch(allow_mismatch: bool) -> None:
    """The torch-version policy: GraderError (naming both versions and the two ways out) when
    the installed torch is not the pinned release, unless ``allow_mismatch``
    (``--allow-torch-mismatch``)."""
    if not allow_mismatch and not is_pinned_torch(installed := installed_torch()):
        raise GraderError(f"torch {installed} is installed, but the labs are written for torch "
                          f"{PINNED_TORCH}: install torch=={PINNED_TORCH} (README: Why torch is "
                          "pinned), or pass --allow-torch-mismatch to grade anyway (the results "
                          "then record both versions and mark the exercises whose checks depend "
                          f"on behaviour of torch {PINNED_TORCH})")


def _message(ex: Exercise, outcome: Outcome, missing: bool, markdown: bool) -> str:
    """The exercise's message: the likeliest cause first (a missing or markdown answer cell, an
    error its answer cell raised), then what the checks said."""
    parts = [outcome.message]
    if outcome.status != "passed":
        if outcome.answer_errors:
            parts.insert(0, "Your answer cell raised " + "; ".join(outcome.answer_errors) + ".")
        if markdown:
            parts.insert(0, f"The answer cell of {ex.id} is a markdown cell, so it did not run: "
                            "change it back to a code cell (Cell type: Code).")
        elif missing:
            parts.insert(0, f"No answer cell for {ex.id} was found: answer cells are recognised "
                            "by their cell metadata or id, which your notebook's cells do not "
                            "carry (some editors drop them). Paste your answer into the answer "
                            f"cell of {ex.id} in a fresh copy of the released notebook (the "
                            f"cell that raises NotImplementedError(\"{ex.id}\")).")
    return " ".join(p for p in parts if p)


def _failed_result(lab: Lab | None, path: Path, env: Environment, reason: str,
                   started: float) -> LabResult:
    why = f"not graded: {reason}"
    exercises = tuple(ExerciseResult(e.id, e.title, "error", 0.0, e.points, why)
                      for e in (lab.exercises if lab else ()))
    return LabResult(lab=lab.id if lab else "unknown", notebook=str(path), exercises=exercises,
                     environment=env, duration_s=round(time.monotonic() - started, 3),
                     error=reason)


def fingerprint(path: Path, *, device: str, timeout: float | None,
                assigned: str | None = None, allow_torch_mismatch: bool = False) -> str:
    """A digest of everything a result depends on except the seed: the submission's bytes, its
    lab's table, checks and release, the grader and torch versions, the device, the time limit,
    the lab the batch assigns and the torch-version policy (see :func:`grade_notebook`)."""
    h = hashlib.sha256()
    h.update(json.dumps([__version__, installed_torch(), device, timeout, assigned,
                         allow_torch_mismatch]).encode())
    h.update(path.read_bytes() if path.is_file() else b"")
    try:
        lab = load_lab(lab_of(notebook.read(path), path))
    except GraderError:
        if (lab := _lab_from_name(path, assigned)) is None:
            return h.hexdigest()
    lab_dir = lab.root / "labs" / lab.id
    for f in sorted([*lab_dir.rglob("*.py"), *lab_dir.rglob("*.toml"), lab.release_path]):
        if not f.is_file():
            continue
        h.update(str(f.relative_to(lab.root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def hand_in_digest(path: Path) -> str:
    """SHA-256 of the hand-in's bytes ("" when it cannot be read): a batch compares them before
    and after, and reports a hand-in that changed meanwhile."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _lab_from_name(path: Path, default: str | None = None) -> Lab | None:
    """The lab the file name names, else the lab ``default``, else None."""
    try:
        return load_lab(name) if (name := lab_from_name(path) or default) else None
    except GraderError:
        return None


def grade_notebook(path: Path, out_dir: Path, *, device: str = "cpu", seed: int | None = None,
                   timeout: float | None = None, name: str | None = None,
                   learner: str | None = None, assigned: str | None = None,
                   allow_torch_mismatch: bool = False, threads: int | None = None,
                   on_outcome: Callable[[Outcome], None] | None = None,
                   hide: tuple[str, ...] = ()) -> LabResult:
    """Grade the notebook at ``path``; write ``out_dir/<name>.json`` and the executed notebook
    ``out_dir/<name>.executed.ipynb`` (``name`` defaults to the file's stem); return the result.

    ``timeout`` (seconds) overrides every exercise's time limit; ``learner`` is recorded in the
    result; ``assigned`` is the lab the batch assigns: a notebook that does not say which lab it
    is (see :func:`grader.labs.lab_of`) is graded as that lab, with a note, and one that cannot
    be read scores 0 of that lab's points. The result records the notebook's absolute path.
    Under a torch other than the pinned release the notebook is not graded (the result's
    ``error`` says why: :func:`check_torch`) unless ``allow_torch_mismatch``; then the
    notebook's setup cell is told to allow it (the ``torch_policy`` parameter, which is
    ``refuse`` otherwise) and the exercises whose checks depend on the pinned release
    (``pinned_behaviour``) carry ``version_caveat``. ``threads``: the CPU threads the kernel's
    libraries may use (default: one per core; a batch of N jobs gives each its share, so the
    kernels that run at once do not fight over the cores: :func:`grader.judge.sandbox.kernel_env`).
    ``hide``: folders the kernel must not see beside those it never sees (the course's
    reference solutions, ``out_dir``, the hidden checks of a lab judged wholly by the grader):
    the batch's hand-ins (:func:`grader.judge.sandbox.isolation` says where hiding works).
    Never raises for a bad submission: the result's ``error`` says why grading could not
    happen."""
    started = time.monotonic()
    name = name or path.stem
    seed = new_seed() if seed is None else seed
    env = Environment.current(device, seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    lab = None
    try:
        submission = notebook.read(path)
        try:
            lab, notes = load_lab(lab_of(submission, path)), []
        except GraderError as exc:
            if assigned is None:
                raise
            lab = load_lab(assigned)
            notes = [f"{str(exc).replace(str(path), path.name).split(': ', 1)[-1]}; it was "
                     f"graded as {assigned}, the lab this batch assigns"]
        check_torch(allow_torch_mismatch)
        result = _grade(path, submission, lab, env, out_dir / f"{name}.executed.ipynb",
                        timeout=timeout, on_outcome=on_outcome, started=started, notes=notes,
                        torch_policy="allow" if allow_torch_mismatch else "refuse",
                        threads=threads or os.cpu_count() or 1,
                        hide=(*hide, str(out_dir.absolute())))
    except GraderError as exc:  # unreadable, unknown lab: the file name may still say which lab
        # the learner sees this reason: name their file, not the folders it sits in here
        reason = str(exc).replace(str(path), path.name)
        named = lab or _lab_from_name(path)
        result = _failed_result(named or _lab_from_name(path, assigned), path, env, reason,
                                started)
        if named is None and result.lab == assigned:  # (nothing in the file said which lab)
            result = replace(result, notes=(f"it could not be read to tell which lab it is; it "
                                            f"was counted as {assigned}, the lab this batch "
                                            "assigns",))
    except Exception as exc:  # an input nobody foresaw: it costs this notebook only
        result = _failed_result(lab or _lab_from_name(path, assigned), path, env,
                                f"internal error while grading: {type(exc).__name__}: {exc}",
                                started)
    result = replace(result, notebook=str(path.absolute()), learner=learner,
                     fingerprint=fingerprint(path, device=device, timeout=timeout,
                                             assigned=assigned,
                                             allow_torch_mismatch=allow_torch_mismatch))
    result.write(out_dir / f"{name}.json")
    return result


def record_failure(path: Path, out_dir: Path, *, name: str, learner: str | None, device: str,
                   seed: int, reason: str, assigned: str | None = None) -> LabResult:
    """Write and return the result of a notebook that could not be graded at all, for
    ``reason``."""
    result = replace(_failed_result(_lab_from_name(path, assigned), path,
                                    Environment.current(device, seed), reason, time.monotonic()),
                     learner=learner, notebook=str(path.absolute()))
    result.write(out_dir / f"{name}.json")
    return result


def _origin_notes(submission, lab: Lab, path: Path) -> list[str]:
    """Notes when the notebook asks for another kernel, or its file name names another lab."""
    notes = []
    spec = submission.get("metadata", {}).get("kernelspec", {})
    wanted = spec.get("name") if isinstance(spec, dict) else None
    if wanted not in (None, "python3"):
        notes.append(f"the notebook asks for the kernel {wanted!r}; it was graded with the "
                     "course's kernel, python3")
    named = _lab_from_name(path)
    if named is not None and named.id != lab.id:
        notes.append(f"the file name says lab {named.id}, but the notebook is lab {lab.id} (its "
                     f"metadata or cells); it was graded as {lab.id}")
    return notes


def warm_cache_dir(lab: Lab) -> Path:
    """``lab``'s warm Inductor cache, for the installed torch:
    ``build/cache/inductor-<torch version>/<lab>`` in its course (one per lab: a kernel copies
    only what its own lab's reference compiled; see :func:`grader.judge.sandbox.warm_cache`)."""
    return lab.root / "build" / "cache" / f"inductor-{installed_torch()}" / lab.id


@functools.lru_cache(maxsize=None)
def kernel_isolation() -> Isolation:
    """How this machine isolates kernels (:func:`grader.judge.sandbox.isolation`, tried once per
    process)."""
    import importlib.util
    import sys

    torch = importlib.util.find_spec("torch")  # (found, not imported: 2 s of the grader)
    readable = [Path(sys.executable).resolve(), Path(__file__).resolve(),
                *([Path(torch.origin)] if torch and torch.origin else [])]
    return isolation(readable)


def _course_hidden(lab: Lab) -> tuple[str, ...]:
    """What a grading kernel of ``lab`` must not see of its course: every folder of it but
    ``grader/`` and ``labs/`` (and one holding the interpreter, such as a venv): the reference
    solutions, the repository's history (``.git``), earlier grades (``build/``), the tests; and
    every lab's checks (the judges, which run in the grader's process) and its
    ``instructor_only`` files (such as lab 3's reference model) with their folder's
    ``__pycache__``."""
    hidden = set()
    for root in {lab.root, grader.ROOT}:
        hidden |= {p for p in root.iterdir() if p.is_dir() and not p.is_symlink()
                   and p.name not in ("grader", "labs") and not _needed(p, lab)}
        hidden |= set((root / "labs").glob("*/checks*"))
    for other in map(load_lab, lab_ids()):
        for name in other.instructor_only:
            path = other.root / "labs" / other.id / name
            if path.exists():
                # and its folder's bytecode cache, made now if missing: the judges import the
                # file while kernels run, and what Python compiles of it lands there
                cache = path.parent / "__pycache__"
                with contextlib.suppress(OSError):
                    cache.mkdir(exist_ok=True)
                hidden |= {path, cache} if cache.is_dir() else {path}
    return tuple(sorted(map(str, hidden)))


def runs_folder() -> Path:
    """The folder every run folder of this user's gradings is made in,
    ``<temp>/grader-runs-<uid>`` (mode 0711: a kernel's user may cross it into its own run
    folder only): one folder that a kernel's mount namespace hides whole, its own run put back,
    wherever the course and the interpreter are. Raises GraderError when that name is taken by
    something else (a link, a file, another user's folder)."""
    folder = Path(tempfile.gettempdir()) / f"grader-runs-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o711)
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
        raise GraderError(f"{folder} is not a folder of this user's; remove it, then grade again")
    return folder


#: the shortest line of a check's source that, quoted in an output, withholds the output
QUOTED_LINE = 40


def _withhold_check_source(executed: Path, lab: Lab) -> int:
    """Replace each output of the executed notebook that quotes a line of ``lab``'s checks (of
    at least QUOTED_LINE characters) with a note, so that no report built from it shows the
    checks' source, wherever the kernel could read them from; return how many were replaced."""
    lines = set()
    for f in (lab.root / "labs" / lab.id).glob("checks*"):
        for py in [f] if f.is_file() else f.rglob("*.py"):
            lines |= {t for raw in py.read_text(encoding="utf-8").splitlines()
                      if len(t := raw.strip()) >= QUOTED_LINE}
    nb = notebook.read(executed)
    count = 0
    for cell in nb.cells:
        for i, out in enumerate(cell.get("outputs", [])):
            texts = [out.get("text", "")] + [v for v in out.get("data", {}).values()
                                            if isinstance(v, str)]
            if any(line.strip() in lines for t in texts for line in str(t).splitlines()):
                cell.outputs[i] = v4.new_output("stream", name="stderr", text=(
                    "[grader] this output quoted the grader's checks and was withheld\n"))
                count += 1
    if count:
        notebook.write(nb, executed)
    return count


def _load_judges(lab: Lab, seed: int) -> None:
    """Import ``lab``'s checks (and so torch and what they judge with) in a thread of their
    own, while its kernel starts and runs its first cells, instead of when the first exercise
    is judged (2 to 4 s of a lab's grading), and start there what they do ahead for ``seed``
    (:func:`grader.checks.ahead`: lab 5's oracle rank worlds)."""
    import threading

    from grader.checks import start_ahead

    threading.Thread(target=start_ahead, args=(lab.id, seed), daemon=True,
                     name="load-judges").start()


def _needed(folder: Path, lab: Lab) -> bool:
    """Whether a kernel of ``lab`` needs something in ``folder``: the lab's course, the
    interpreter or its libraries (a venv inside the course, say)."""
    import sys

    needed = [lab.root, Path(sys.prefix), Path(sys.executable).resolve().parent]
    folder = folder.resolve()
    return any(p.resolve() == folder or folder in p.resolve().parents for p in needed)


def _chown_tree(folder: Path, uid: int, gid: int) -> None:
    os.chown(folder, uid, gid)
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.chown(os.path.join(base, name), uid, gid, follow_symlinks=False)


def _grade(path: Path, submission, lab: Lab, env: Environment, executed: Path, *,
           timeout: float | None, on_outcome: Callable[[Outcome], None] | None,
           started: float, notes: list[str], torch_policy: str,
           threads: int | None, hide: tuple[str, ...]) -> LabResult:
    """Assemble, execute and score a readable submission of ``lab``; ``torch_policy`` is the
    notebook's parameter of that name (see :func:`grader.kernel.selfcheck.require_torch`)."""
    device, seed = env.device, env.seed
    release = notebook.read(lab.release_path)
    skipped = {e.id: r for e in lab.exercises if (r := e.unmet(device))}
    built = assemble(release, submission, lab, skipped=skipped)
    outcomes: dict[str, Outcome] = {}

    def record(outcome: Outcome) -> None:
        outcomes[outcome.exercise] = outcome
        if on_outcome:
            on_outcome(outcome)

    error = None
    timeouts = {e.id: timeout or e.timeout for e in lab.exercises}
    # CPU seconds: every core busy for the whole lab's time, plus start-up (a backstop only)
    walls = kernel_isolation()
    user = walls.user
    limits = Limits(memory=int(lab.memory_gib * 2**30),
                    cpu=int((sum(timeouts.values()) + 300) * (os.cpu_count() or 1)),
                    threads=threads, user=user,
                    hide=(*hide, *_course_hidden(lab), str(runs_folder()))
                    if walls.namespace else ())
    # the kernel works in run/work (empty: only what the learner writes lands there); its
    # home, temporary files and sockets are in run/home
    # Inductor's cache starts warm: a copy of what the course's reference solutions compiled;
    # only a run of the reference solution itself (these very bytes) writes that back
    warm = warm_cache_dir(lab)
    reference = lab.root / "solutions" / f"{lab.notebook}.ipynb"
    with tempfile.TemporaryDirectory(prefix="grade-", dir=runs_folder()) as run:
        work, home = Path(run) / "work", Path(run) / "home"
        work.mkdir()
        (home / "probe").mkdir(parents=True)
        warm_cache(home, warm)
        if user:  # the kernel's user owns its folders; the run folder it may only cross
            os.chmod(run, 0o711)
            for folder in (work, home):
                _chown_tree(folder, *user)
        limits = replace(limits, writable=(run,))
        _load_judges(lab, seed)
        try:
            papermill.execute_notebook(
                built.nb, str(executed),
                parameters={"device": device, "seed": seed, "torch_policy": torch_policy},
                engine_name="grader", kernel_name="python3", progress_bar=False, cwd=str(work),
                on_outcome=record, timeouts=timeouts, workdir=work, home=home, limits=limits,
                input_name=path.name, seed=seed, device=device)
        except PapermillExecutionError:
            pass  # some cell raised: each exercise's outcome already says what that cost
        except Exception as exc:  # the kernel could not start, the output could not be written...
            error = f"execution failed: {type(exc).__name__}: {exc}"
        if reference.is_file() and reference.read_bytes() == path.read_bytes():
            keep_warm_cache(home, warm)
    if executed.is_file() and (withheld := _withhold_check_source(executed, lab)):
        notes.append(f"{withheld} output(s) of the notebook quoted the grader's checks and were "
                     "withheld")

    results = []
    for e in lab.exercises:
        if e.id in skipped:
            results.append(ExerciseResult(e.id, e.title, "skipped", 0.0, e.points, skipped[e.id]))
        elif (o := outcomes.get(e.id)) is not None:
            results.append(ExerciseResult(
                e.id, e.title, o.status, e.points if o.status == "passed" else 0.0, e.points,
                _message(e, o, e.id in built.missing, e.id in built.markdown),
                round(o.duration_s, 3)))
        else:
            results.append(ExerciseResult(e.id, e.title, "error", 0.0, e.points,
                                          f"not graded: {error or 'its checks never ran'}"))
    if env.torch_mismatch:  # (allowed: see grade_notebook)
        marked = {e.id for e in lab.exercises if e.pinned_behaviour}
        results = [replace(r, version_caveat=r.id in marked and r.status != "skipped")
                   for r in results]
    notes = notes + [f"{notebook.describe(cell)} differs from the release; the released "
                     "version was run" for cell in built.edited]
    passed = {r.id for r in results if r.status == "passed"}
    notes += [f"no answer cell for {ex}" + ("; another cell of the notebook defines its answer, "
                                            "which was graded" if ex in passed else "")
              for ex in built.missing if ex not in built.markdown]
    notes += built.notes + _origin_notes(submission, lab, path)
    if withheld := sum(e.withheld for e in lab.exercises):  # a learner's copy (grader dist)
        notes.append(f"public checks only: this copy of the course has none of the lab's "
                     f"{withheld} hidden checks, which your instructor's grader also runs, on "
                     "other inputs; this score is not your grade")
    return LabResult(lab=lab.id, notebook=str(path), exercises=tuple(results), environment=env,
                     duration_s=round(time.monotonic() - started, 3), notes=tuple(notes),
                     error=error)
