"""A lab's exercise table: ids, titles, points, requirements and time limits.

Each lab keeps its table in ``labs/<lab>/lab.toml`` (the single source of points, timeouts and
requirements) and its checks in the module ``labs.<lab>.checks``.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from grader.errors import GraderError
from grader.kernel.modelled import PROCESSES

#: release cell ids a notebook must share with one lab (and no other) to count as that lab's
MIN_SHARED_IDS = 3


@dataclass(frozen=True)
class Exercise:
    """One graded exercise.

    ``answer`` is the name the learner's answer cell binds in the notebook (a function, class
    or value); ``timeout`` is the exercise's time limit in seconds; ``requires`` lists what it
    needs to run (``cpu``, ``cuda``, ``cuda>=2``, ``cxx``: a C++ compiler and ninja, ``nvcc``:
    the CUDA toolkit);
    ``pinned_behaviour``: its checks depend on behaviour of the pinned torch release (they
    compare with values, orders, counts or rules typed in from it, or its reference answer
    relies on internals another release may lack), not only on the installed torch as the
    oracle: a run under another release (``grader grade --allow-torch-mismatch``) marks its
    result (``version_caveat``); ``withheld``: how many of its hidden checks this copy of the
    course does not have (a learner's copy: ``grader dist student`` writes it; 0 in the course
    itself), so checks are still numbered as the instructor's grader numbers them; ``models``:
    the PyTorch code of the mechanism the exercise asks the learner to build or predict
    (patterns of :mod:`grader.kernel.modelled`): an answer that runs it, or starts a process,
    fails, whatever it returns; ``starts_processes = true`` in the table (a loader's workers)
    adds :data:`~grader.kernel.modelled.PROCESSES` to them, so that starting a process is not
    refused.
    """

    id: str
    title: str
    answer: str
    points: float
    requires: tuple[str, ...] = ("cpu",)
    timeout: float = 120.0
    pinned_behaviour: bool = False
    withheld: int = 0
    models: tuple[str, ...] = ()

    def unmet(self, device: str) -> str | None:
        """Why this exercise cannot run on ``device`` (``cpu``/``cuda``) here; None if it can."""
        for need in self.requires:
            if need == "cpu":
                continue
            if need.startswith("cuda"):
                count = int(need.partition(">=")[2] or 1)
                if device != "cuda":
                    return f"needs {need} (a CUDA GPU); this run's device is {device}"
                import torch

                if torch.cuda.device_count() < count:
                    return f"needs {need}; {torch.cuda.device_count()} CUDA device(s) visible"
            elif need == "cxx":
                if not (shutil.which("c++") or shutil.which("g++")):
                    return "needs a C++ compiler (c++ or g++ on PATH)"
                if not (shutil.which("ninja") or importlib.util.find_spec("ninja")):
                    return "needs ninja (on PATH, or `pip install ninja`) to build C++ extensions"
            elif need == "nvcc":
                from torch.utils.cpp_extension import CUDA_HOME

                if CUDA_HOME is None:
                    return ("needs nvcc (the CUDA toolkit: CUDA_HOME, or nvcc on PATH) to build "
                            "CUDA extensions")
            else:
                return f"unknown requirement {need!r} in the lab table"
        return None


@dataclass(frozen=True)
class Lab:
    """A lab: its id (``autograd``), title, notebook stem (``02_autograd``), exercises, and
    ``root``, the course folder holding ``labs/<id>/``, ``solutions/`` and ``notebooks/``;
    ``memory_gib``, the memory (GiB) a grading kernel of this lab may use (``memory_gib`` in
    the table, default 4); ``instructor_only``, files of ``labs/<id>/`` (paths relative to it)
    that the learners' copy leaves out (so they may be missing) and a grading kernel does not
    see, such as a reference model that answers exercises (``instructor_only`` in the table,
    default none)."""

    id: str
    title: str
    notebook: str
    exercises: tuple[Exercise, ...]
    root: Path
    memory_gib: float = 4.0
    instructor_only: tuple[str, ...] = ()

    @property
    def release_path(self) -> Path:
        """The released (learner) notebook the grader restores cells from."""
        return self.root / "notebooks" / f"{self.notebook}.ipynb"

    @property
    def max_score(self) -> float:
        return sum(e.points for e in self.exercises)

    def exercise(self, exercise_id: str) -> Exercise:
        for e in self.exercises:
            if e.id == exercise_id:
                return e
        raise GraderError(f"lab {self.id!r} has no exercise {exercise_id!r}")


def _tables() -> dict[str, Path]:
    import labs

    found: dict[str, Path] = {}
    for base in labs.__path__:
        for table in sorted(Path(base).glob("*/lab.toml")):
            found.setdefault(table.parent.name, table)
    return found


def lab_ids() -> list[str]:
    """The ids of every lab that has a ``lab.toml``, sorted."""
    return sorted(_tables())


def _flag(value) -> bool:
    """A true/false field of the lab table (TypeError for anything else, such as "false")."""
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


def _strings(value) -> tuple[str, ...]:
    """A list-of-strings field of the lab table (TypeError for anything else)."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise TypeError(f"{value!r} is not a list of strings")
    return tuple(value)


def modelled(exercise_id: str) -> tuple[str, ...]:
    """The ``models`` patterns of ``exercise_id`` (empty for an id no lab table has)."""
    lab_id = exercise_id.partition(".")[0]
    if lab_id not in _tables():
        return ()
    return next((e.models for e in load_lab(lab_id).exercises if e.id == exercise_id), ())


def load_lab(lab_id: str) -> Lab:
    """Read ``labs/<lab_id>/lab.toml``. Raises GraderError if the lab or a field is missing."""
    path = _tables().get(lab_id)
    if path is None:
        raise GraderError(f"no lab {lab_id!r} (known labs: {', '.join(lab_ids())})")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        exercises = tuple(
            Exercise(
                id=e["id"],
                title=e["title"],
                answer=e["answer"],
                points=float(e["points"]),
                requires=tuple(e.get("requires", ["cpu"])),
                timeout=float(e.get("timeout", 120)),
                pinned_behaviour=_flag(e.get("pinned_behaviour", False)),
                withheld=int(e.get("withheld", 0)),
                models=_strings(e.get("models", [])) + (
                    (PROCESSES,) if _flag(e.get("starts_processes", False)) else ()),
            )
            for e in raw["exercises"]
        )
        lab = Lab(id=raw["id"], title=raw["title"], notebook=raw["notebook"], exercises=exercises,
                  root=path.parent.parent.parent, memory_gib=float(raw.get("memory_gib", 4)),
                  instructor_only=tuple(raw.get("instructor_only", ())))
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise GraderError(f"{path}: malformed lab table ({exc!r})") from exc
    for e in exercises:
        if not e.id.startswith(f"{lab.id}."):
            raise GraderError(f"{path}: exercise id {e.id!r} must start with '{lab.id}.'")
    return lab


#: how many progressive hints each exercise has (labs/<lab>/hints.toml)
HINTS_PER_EXERCISE = range(2, 4)


@functools.lru_cache(maxsize=None)
def load_hints(lab_id: str) -> dict[str, tuple[str, ...]]:
    """The lab's hints, ``labs/<lab_id>/hints.toml``: exercise id -> its 2-3 progressive hints
    (markdown, the first a nudge, the last closest to the approach). Empty when the lab has no
    such file. Raises GraderError for a malformed file, an id the lab does not have, or a count
    outside HINTS_PER_EXERCISE."""
    lab = load_lab(lab_id)
    path = _tables()[lab_id].parent / "hints.toml"
    if not path.exists():
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise GraderError(f"{path}: malformed hints ({exc})") from exc
    known = {e.id for e in lab.exercises}
    for key, hints in raw.items():
        if key not in known:
            raise GraderError(f"{path}: {key!r} is not an exercise of lab {lab_id!r}")
        if (not isinstance(hints, list) or len(hints) not in HINTS_PER_EXERCISE
                or not all(isinstance(h, str) and h.strip() for h in hints)):
            raise GraderError(f"{path}: {key!r} needs a list of {HINTS_PER_EXERCISE.start}-"
                              f"{HINTS_PER_EXERCISE.stop - 1} non-empty strings")
    return {key: tuple(h.strip() for h in hints) for key, hints in raw.items()}


def plain_stem(stem: str) -> str:
    """A file stem without the marks that copying adds: ``Copy of 02_autograd (2)`` (browsers,
    Google Drive), ``02_autograd-Copy1`` (JupyterLab), ``02_autograd copy 2`` (macOS Finder)
    all give ``02_autograd``."""
    previous = None
    while previous != stem:
        previous = stem
        stem = re.sub(r"^copy of\s+", "", stem, flags=re.IGNORECASE)
        stem = re.sub(r"(\s*\(\d+\)|-copy\d*|\s+copy(\s+\d+)?)$", "", stem,
                      flags=re.IGNORECASE).strip()
    return stem


def lab_from_name(path: str | Path) -> str | None:
    """The one lab whose id appears in the file's name as a word (``02_autograd``,
    ``alice_02_autograd``, ``02_autograd-Copy1``, ``Copy of 02_autograd (2)``), else None."""
    stem = plain_stem(Path(path).stem).lower()
    named = [lab for lab in lab_ids()
             if re.search(rf"(?<![a-z0-9]){re.escape(lab)}(?![a-z0-9])", stem)]
    return named[0] if len(named) == 1 else None


@functools.lru_cache(maxsize=None)
def _own_ids() -> dict[str, frozenset[str]]:
    """lab id -> the cell ids of its released notebook that no other lab's release has."""
    from grader import notebook  # (not at import: grading kernels load this module)

    ids = {}
    for lab_id in lab_ids():
        try:
            ids[lab_id] = {c.get("id") for c in notebook.read(load_lab(lab_id).release_path).cells}
        except GraderError:  # a lab without a release yet (while it is written)
            ids[lab_id] = set()
    return {lab: frozenset(mine - set().union(*(v for k, v in ids.items() if k != lab)))
            for lab, mine in ids.items()}


def lab_of(nb, path: str | Path) -> str:
    """The lab id of notebook ``nb`` read from ``path``: its ``metadata.course.lab``; else the
    lab whose release cell ids (at least MIN_SHARED_IDS of those only it has) or exercise ids
    (in answer cells' metadata) its cells carry, whatever the file is called; else the lab its
    file name names (:func:`lab_from_name`).

    Raises GraderError when none of them says."""
    from grader import notebook

    meta = nb.get("metadata", {}).get("course")
    if isinstance(meta, dict) and isinstance(meta.get("lab"), str):
        return meta["lab"]
    cells = nb.get("cells", [])
    ids = {c.get("id") for c in cells}
    shared = Counter({lab: len(ids & own) for lab, own in _own_ids().items()})
    if shared and (best := shared.most_common(1)[0])[1] >= MIN_SHARED_IDS:
        return best[0]
    exercises = Counter(str(notebook.exercise_of(c)).split(".", 1)[0] for c in cells
                        if notebook.exercise_of(c))
    if exercises and (best := exercises.most_common(1)[0])[0] in lab_ids():
        return best[0]
    if named := lab_from_name(path):
        return named
    raise GraderError(f"{path}: cannot tell which lab this is (no metadata.course.lab, no cells "
                      "of a released lab notebook, and no lab named in the file name)")
