"""A lab's exercise table: ids, titles, points, requirements and time limits.

Each lab keeps its table in ``labs/<lab>/lab.toml`` (the single source of points, timeouts and
requirements) and its checks in the module ``labs.<lab>.checks``.
"""
from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from grader.errors import GraderError


@dataclass(frozen=True)
class Exercise:
    """One graded exercise.

    ``answer`` is the name the learner's answer cell binds in the notebook (a function, class or
    value); ``timeout`` is the exercise's time limit in seconds; ``requires`` lists what it needs
    to run (``cpu``, ``cuda``, ``cuda>=2``, ``cxx``).
    """

    id: str
    title: str
    answer: str
    points: float
    requires: tuple[str, ...] = ("cpu",)
    timeout: float = 120.0

    def unmet(self, device: str) -> str | None:
        """Why this exercise cannot run on ``device`` (``cpu``/``cuda``) here, or None if it can."""
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
            else:
                return f"unknown requirement {need!r} in the lab table"
        return None


@dataclass(frozen=True)
class Lab:
    """A lab: its id (``autograd``), title, notebook stem (``02_autograd``), exercises, and
    ``root``, the course folder holding ``labs/<id>/``, ``solutions/`` and ``notebooks/``;
    ``memory_gib``, the memory (GiB) a grading kernel of this lab may use (``memory_gib`` in
    the table, default 4)."""

    id: str
    title: str
    notebook: str
    exercises: tuple[Exercise, ...]
    root: Path
    memory_gib: float = 4.0

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
            )
            for e in raw["exercises"]
        )
        lab = Lab(id=raw["id"], title=raw["title"], notebook=raw["notebook"], exercises=exercises,
                  root=path.parent.parent.parent, memory_gib=float(raw.get("memory_gib", 4)))
    except (KeyError, TypeError, ValueError, tomllib.TOMLDecodeError) as exc:
        raise GraderError(f"{path}: malformed lab table ({exc!r})") from exc
    for e in exercises:
        if not e.id.startswith(f"{lab.id}."):
            raise GraderError(f"{path}: exercise id {e.id!r} must start with '{lab.id}.'")
    return lab
