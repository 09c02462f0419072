"""A batch: find the submissions and who they belong to, grade them (in parallel, each in its own
kernel and working folder), and skip the ones already graded unchanged (resume).

Learners are identified from the path: ``submissions/<learner>/...`` (a folder per learner,
whatever the files are called) or ``<learner>_<NN_lab>.ipynb`` / ``<learner>_<lab>.ipynb`` (a
flat folder; the marks copies add, ``-Copy1``, ``Copy of``, `` (2)``, are ignored); any other
file name is its own learner. The lab comes from the notebook (see :func:`grader.labs.lab_of`).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterator

import grader
from grader import notebook
from grader.errors import GraderError
from grader.judge.grade import fingerprint, grade_notebook, record_failure
from grader.labs import lab_ids, lab_of, plain_stem
from grader.results import LabResult, read_verified


@dataclass(frozen=True)
class Submission:
    """One notebook to grade: its path, its learner, and ``name``, the stem of its result files
    in the output folder (unique within the batch)."""

    path: Path
    learner: str
    name: str


def learner_of(path: Path, root: Path | None = None) -> str:
    """Who submitted ``path``: when ``path`` lies in a folder under the searched folder
    ``root``, that folder (``root/<learner>/...``, whatever the file is called); else the
    prefix of ``<learner>_<NN_lab>.ipynb`` or ``<learner>_<lab>.ipynb`` (copy marks removed:
    :func:`plain_stem`); else, for ``<NN_lab>.ipynb``, its folder (``alice/02_autograd.ipynb``,
    or a learner's own folder searched: ``work/``); else the file's stem."""
    if root is not None and len(parts := path.relative_to(root).parts) > 1:
        return parts[0]
    stem = plain_stem(path.stem)
    for lab in lab_ids():
        if re.fullmatch(rf"(?:\d+_)?{re.escape(lab)}", stem, re.IGNORECASE):
            return path.parent.name or stem
        if m := re.fullmatch(rf"(.+?)[ _-]+(?:\d+_)?{re.escape(lab)}", stem, re.IGNORECASE):
            return m.group(1)
    return stem


def find_submissions(paths: list[str]) -> list[Submission]:
    """The notebooks named, and those under the folders named (recursively, skipping hidden
    folders such as .ipynb_checkpoints and the grader's own ``*.executed.ipynb``), in a fixed
    order. Result names do not depend on what else is in the batch: the file's stem when it
    starts with the learner's name (``alice_02_autograd``), else ``<learner>-<stem>``
    (``alice-02_autograd`` for ``alice/02_autograd.ipynb``); should two still coincide, the
    later ones get ``-2``, ``-3``... (one learner's name never stops another's grading).

    Raises GraderError for a missing path or no notebooks."""
    found: list[tuple[Path, Path | None]] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += [(q, p) for q in sorted(p.rglob("*.ipynb"))
                      if not q.name.endswith(".executed.ipynb")
                      and not any(part.startswith(".") for part in q.relative_to(p).parts)]
        elif p.is_file():
            found.append((p, None))
        else:
            raise GraderError(f"{p}: no such file or folder")
    if not found:
        raise GraderError(f"no notebooks found in {', '.join(paths)}")
    # Files without a learner's name right in a searched folder belong to that folder (a
    # learner's own: alice/, work/); two copies of one lab there are two learners, each named by
    # its file (a class folder of unnamed files: 02_autograd-Copy1, Copy of 02_autograd (2)).
    copies = Counter((root, plain_stem(p.stem).lower()) for p, root in found
                     if root is not None and p.parent == root)
    subs, taken = [], set()
    for p, root in found:
        learner = learner_of(p, root)
        if (root is not None and p.parent == root and learner == (root.name or p.stem)
                and copies[(root, plain_stem(p.stem).lower())] > 1):
            learner = p.stem
        name = p.stem if p.stem.startswith(learner) else f"{learner}-{p.stem}"
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}-{n}"
        taken.add(unique)
        subs.append(Submission(p, learner, unique))
    return subs


#: the file ``grader grade --shard K/N`` writes in its --out, beside the results: the shard, the
#: split and the names of the whole batch, so that ``grader merge`` notices a shard that is lost
SHARD_MANIFEST = "shard.json"


def shard(subs: list[Submission], k: int, n: int) -> list[Submission]:
    """Shard ``k`` of ``n`` (1 <= k <= n) of a batch in :func:`find_submissions`' order: every
    ``n``-th submission from the ``k``-th, so the shards are disjoint, cover the batch, differ in
    size by one at most and interleave its learners and labs (each shard gets a like share of
    the slow labs). Names come from the whole batch, so a shard's result files are named as an
    unsharded run names them."""
    return subs[k - 1::n]


def write_manifest(out: Path, k: int, n: int, seed: int, batch: list[Submission]) -> None:
    """Write ``out/shard.json`` for shard ``k`` of ``n`` of ``batch`` (the whole batch, in
    :func:`find_submissions`' order), graded with ``seed``: written before grading, so an empty
    shard, or one whose job is killed, leaves it too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / SHARD_MANIFEST).write_text(json.dumps(
        {"shard": k, "of": n, "seed": seed, "batch": [s.name for s in batch]}, indent=1) + "\n",
        encoding="utf-8")


def missing_from_shards(dirs: list[Path], merged: set[str]) -> list[str]:
    """What the shard manifests (:data:`SHARD_MANIFEST`) in ``dirs`` say a merge of them lacks,
    ``merged`` being the result names it holds: one line per shard that owes results it does
    not have (a shard lost, never run, or killed mid-way), naming the first few; one line when
    the manifests disagree on the batch or the split (shards graded from different folders or
    at different times), and then no other. Empty when nothing is missing, or no folder has a
    manifest (folders of unsharded runs)."""
    lines, splits = [], set()
    for folder in dirs:
        path = folder / SHARD_MANIFEST
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            n, batch = int(data["of"]), tuple(str(name) for name in data["batch"])
        except (OSError, ValueError, KeyError, TypeError):
            lines.append(f"{path}: not a readable shard manifest")
            continue
        splits.add((n, batch))
    if len(splits) > 1:  # (then which shard owes what has no answer)
        return lines + [f"the shards disagree on the batch or its split ({len(splits)} "
                        "different ones): merge the shards of one run, which all grade the "
                        "same folder with one --shard K/N"]
    for n, batch in sorted(splits):
        for k in range(1, n + 1):
            if owed := [name for name in batch[k - 1::n] if name not in merged]:
                lines.append(f"shard {k}/{n}: no result for {len(owed)} of its "
                             f"{len(batch[k - 1::n])} notebook(s) ({', '.join(owed[:3])}"
                             f"{', ...' if len(owed) > 3 else ''}): the shard was lost, not run "
                             "or stopped; grade it again into its folder and merge again")
    return lines


def assigned_lab(subs: list[Submission], labs: list[str] | None = None) -> str | None:
    """The one lab a batch assigns, if there is one: the only lab of ``labs`` (``--labs``); or,
    when ``labs`` is None, the only lab among the submissions that say which lab they are."""
    if labs is not None:
        return labs[0] if len(labs) == 1 else None
    found = set()
    for sub in subs:
        try:
            found.add(lab_of(notebook.read(sub.path), sub.path))
        except GraderError:  # unreadable, or no lab: it says nothing about the batch
            continue
    return found.pop() if len(found) == 1 else None


def previous(out_dir: Path, sub: Submission, print_: str,
             seed: int | None = None) -> LabResult | None:
    """The result already in ``out_dir`` for ``sub`` if it has fingerprint ``print_`` (and, when
    ``seed`` is given, was graded with that seed) and its digest verifies (see
    :func:`grader.results.read_verified`)."""
    result = read_verified(out_dir / f"{sub.name}.json")
    if result is None:  # none, or not the grader's own (a digest that does not verify)
        return None
    if result.fingerprint != print_ or (seed is not None and result.environment.seed != seed):
        return None
    return result


def merge_shards(dirs: list[Path], out: Path) -> tuple[list[str], list[str]]:
    """Copy the results of shard folders (the ``--out`` of ``grader grade --shard K/N``) into
    ``out``: each ``<name>.json`` that is a result whose digest verifies under its folder's key
    (written there by the grader: :func:`grader.results.read_verified`), with its
    ``<name>.executed.ipynb``; return (the names copied, sorted; the paths of results refused
    because their digest does not verify). A refused result whose name has no verified copy in
    another folder is replaced in ``out`` by a result of its lab that scores 0 and says why
    (:func:`grader.judge.grade.record_failure`; its learner and lab as the refused file names
    them), so its learner keeps a gradebook row until that notebook is graded again. Results
    already in ``out`` stay (a name in both is replaced).

    Raises GraderError, before copying anything, for a folder that does not exist, folders
    that hold no result, or one name with two different results (shards of two batches, or of
    one batch graded with two seeds)."""
    found: dict[str, tuple[Path, LabResult]] = {}
    refused = []
    for folder in dirs:
        if not folder.is_dir():
            raise GraderError(f"{folder}: no such folder (give the --out folders of the shards)")
        for path in sorted(folder.glob("*.json")):
            try:
                LabResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not a result
            if (result := read_verified(path)) is None:
                refused.append(path)
                continue
            name = path.name.removesuffix(".json")
            if name in found and found[name][1].to_dict() != result.to_dict():
                raise GraderError(f"{name}: two different results, in {found[name][0].parent} "
                                  f"and {folder}: two gradings of one notebook (shards of two "
                                  "runs, or a folder of an earlier run); merge the shards of "
                                  "one run (grader grade --shard K/N --seed S)")
            found[name] = (path, result)
    if not found and not refused:
        raise GraderError(f"no results in {', '.join(map(str, dirs))} (give the --out folders "
                          "of the shards)")
    out.mkdir(parents=True, exist_ok=True)
    for name, (path, result) in found.items():
        if path.resolve() != (out / path.name).resolve():
            result.write(out / path.name)
        executed = path.with_name(f"{name}.executed.ipynb")
        if executed.is_file() and executed.resolve() != (out / executed.name).resolve():
            shutil.copyfile(executed, out / executed.name)
    for path in refused:
        name = path.name.removesuffix(".json")
        if name not in found:
            claimed = LabResult.from_dict(json.loads(path.read_text(encoding="utf-8")))
            env = claimed.environment
            record_failure(Path(claimed.notebook), out, name=name, learner=claimed.learner,
                           device=env.device, seed=env.seed, assigned=claimed.lab,
                           reason=f"its result in {path.parent} was changed after the grader "
                                  "wrote it (its digest does not verify), so it counts for "
                                  "nothing: grade this notebook again")
    return sorted(found), [str(p) for p in refused]


def _grade_one(sub: Submission, out_dir: Path, device: str, seed: int,
               timeout: float | None, assigned: str | None, allow: bool,
               threads: int, hide: tuple[str, ...]) -> LabResult:
    return grade_notebook(sub.path, out_dir, device=device, seed=seed, timeout=timeout,
                          name=sub.name, learner=sub.learner, assigned=assigned,
                          allow_torch_mismatch=allow, threads=threads, hide=hide)


def hand_in_folders(subs: list[Submission], course: Path) -> tuple[str, ...]:
    """The folders a kernel must not see of a batch: the one folder holding every hand-in, or,
    when that folder holds the course itself (its ``labs/`` and ``grader/``, which kernels
    import), each hand-in's own folder."""
    parents = sorted({str(s.path.absolute().parent) for s in subs})
    if not parents:
        return ()
    common = Path(os.path.commonpath(parents))
    if course.absolute() == common or common in course.absolute().parents:
        return tuple(p for p in parents if Path(p) != course.absolute())
    return (str(common),)


def grade_all(subs: list[Submission], out_dir: Path, *, device: str, seed: int,
              timeout: float | None, jobs: int = 1, force: bool = False,
              same_seed: bool = False, assigned: str | None = None,
              allow_torch_mismatch: bool = False,
              on_outcome: Callable | None = None) -> Iterator[tuple[Submission, LabResult, bool]]:
    """Grade ``subs``, yielding ``(submission, result, reused)`` as each finishes (in completion
    order; callers sort). A submission whose result in ``out_dir`` has the same fingerprint is
    reused unless ``force`` (with ``same_seed``, only if it was graded with ``seed`` too).
    ``jobs`` > 1 grades in that many worker processes, each notebook in its own kernel and
    temporary folder, each kernel with its share of the CPU cores (threads: cores // jobs);
    ``assigned`` is the lab the batch assigns (see :func:`assigned_lab`);
    ``allow_torch_mismatch``: grade under a torch other than the pinned release (see
    :func:`grader.judge.grade.grade_notebook`);
    ``on_outcome`` (per exercise) is called only when grading runs in this process (one job,
    or one notebook to grade)."""
    hide = hand_in_folders(subs, grader.ROOT)
    todo = []
    for sub in subs:
        old = None if force else previous(out_dir, sub, fingerprint(
            sub.path, device=device, timeout=timeout, assigned=assigned,
            allow_torch_mismatch=allow_torch_mismatch), seed if same_seed else None)
        if old is not None:
            yield sub, old, True
        else:
            todo.append(sub)
    if jobs <= 1 or len(todo) <= 1:
        for sub in todo:
            yield sub, grade_notebook(sub.path, out_dir, device=device, seed=seed,
                                      timeout=timeout, name=sub.name, learner=sub.learner,
                                      assigned=assigned, on_outcome=on_outcome,
                                      allow_torch_mismatch=allow_torch_mismatch,
                                      hide=hide), False
        return
    jobs = min(jobs, len(todo))
    # A submission can kill the worker grading it (its kernel runs as the same user), which
    # breaks the whole pool: the notebooks it took down are graded again, each in a pool of
    # its own, so only the one that did it is recorded as not graded.
    allow = allow_torch_mismatch
    broken = yield from _in_pool(todo, out_dir, device, seed, timeout, assigned, allow, jobs,
                                 hide)
    for sub in broken:
        yield from _in_pool([sub], out_dir, device, seed, timeout, assigned, allow, 1, hide,
                            last_try=True)


def _in_pool(subs: list[Submission], out_dir: Path, device: str, seed: int,
             timeout: float | None, assigned: str | None, allow: bool, jobs: int,
             hide: tuple[str, ...], last_try: bool = False):
    """Grade ``subs`` in a pool of ``jobs`` spawned workers, yielding ``(sub, result, False)``;
    return the submissions lost to a broken pool (recorded as not graded when ``last_try``)."""
    lost = []
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        threads = max(1, (os.cpu_count() or 1) // jobs)
        futures = {pool.submit(_grade_one, sub, out_dir, device, seed, timeout, assigned,
                               allow, threads, hide): sub for sub in subs}
        for future in as_completed(futures):
            sub = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # the worker process died (killed, out of memory)
                if isinstance(exc, BrokenProcessPool) and not last_try:
                    lost.append(sub)
                    continue
                result = record_failure(
                    sub.path, out_dir, name=sub.name, learner=sub.learner, device=device,
                    seed=seed, reason=f"the grading worker died: {type(exc).__name__}: {exc}",
                    assigned=assigned)
            yield sub, result, False
    return lost
