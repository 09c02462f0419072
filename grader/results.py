"""Results: small immutable dataclasses with computed totals; every report is a view of them.

The JSON written by :meth:`LabResult.to_dict` is versioned (``schema``/``schema_version``) and
described by ``grader/result.schema.json``.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import platform
import re
import secrets
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from grader import __version__
from grader.files import atomic_write

SCHEMA = "pytorch-internals-course/lab-result"
SCHEMA_VERSION = 1
STATUSES = ("passed", "failed", "error", "timeout", "crashed", "skipped")
#: the torch release the course is written for: pyproject.toml pins it (a test keeps the two
#: equal); grading under another release needs ``--allow-torch-mismatch``
PINNED_TORCH = "2.13.0"
#: what marks an exercise with ``version_caveat`` in every report (explained by
#: :func:`mismatch_note`)
CAVEAT_MARK = "†"


def installed_torch() -> str:
    """The installed torch's version as its package records it (``2.13.0+cpu``), or ``not
    installed``."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "not installed"


def is_pinned_torch(version: str) -> bool:
    """Whether ``version`` (``2.13.0+cu128``) is the pinned release, whatever its build."""
    return version.split("+")[0] == PINNED_TORCH


#: a terminal's control sequences (ECMA-48: CSI colour and cursor codes, which IPython puts in
#: tracebacks; OSC sequences such as hyperlinks; other escapes) and control characters but tab,
#: line feed and carriage return: no verdict, result or report keeps them
CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b.?"
                     r"|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", re.S)


@dataclass(frozen=True)
class ExerciseResult:
    """One exercise's outcome. ``points`` is ``max_points`` when passed, else 0;
    ``duration_s`` is wall time in seconds from its first cell to its verdict.
    ``version_caveat``: graded under a torch other than the pinned release, and its checks
    depend on behaviour of that release (``pinned_behaviour`` in the lab table), so its status
    may reflect the version rather than the answer; False in every run on the pinned release.
    ``message`` is kept without terminal control sequences (:data:`CONTROL`)."""

    id: str
    title: str
    status: str
    points: float
    max_points: float
    message: str
    duration_s: float = 0.0
    version_caveat: bool = False

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        object.__setattr__(self, "message", CONTROL.sub("", self.message))


@dataclass(frozen=True)
class Environment:
    """Where and how a run happened. ``started_at`` is an ISO 8601 UTC timestamp;
    ``torch_pinned`` is the release the course pinned when the run happened (None in results
    written before the grader recorded it: those ran on the pinned release)."""

    torch_version: str
    device: str
    seed: int
    grader_version: str
    python_version: str
    started_at: str
    torch_pinned: str | None = None

    @property
    def torch_mismatch(self) -> bool:
        """Whether the run's torch was not the release the course pinned (a run graded with
        ``--allow-torch-mismatch``)."""
        return (self.torch_pinned is not None
                and self.torch_version.split("+")[0] != self.torch_pinned)

    @classmethod
    def current(cls, device: str, seed: int) -> "Environment":
        return cls(torch_version=installed_torch(), device=device, seed=seed,
                   grader_version=__version__, python_version=platform.python_version(),
                   started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   torch_pinned=PINNED_TORCH)


def mismatch_note(env: Environment) -> str:
    """The line every report shows for a run graded under a torch other than the pinned one
    (``env.torch_mismatch``): both versions, and what :data:`CAVEAT_MARK` means."""
    return (f"run with torch {env.torch_version}, but the course pins torch {env.torch_pinned}: "
            f"{CAVEAT_MARK} marks the exercises whose checks depend on behaviour of torch "
            f"{env.torch_pinned}; their status may reflect the version rather than the answer")


@dataclass(frozen=True)
class LabResult:
    """A graded notebook: lab id, the submission's path, exercises, environment, and notes
    (restored cells, missing answers). ``error`` is set when grading itself failed; the
    exercises then carry that reason and score 0. ``fingerprint`` digests everything the result
    depends on but the seed (see :func:`grader.judge.grade.fingerprint`), for resuming a batch;
    ``learner`` is whose submission it is, when a batch knows (see :mod:`grader.judge.batch`)."""

    lab: str
    notebook: str
    exercises: tuple[ExerciseResult, ...]
    environment: Environment
    duration_s: float = 0.0
    notes: tuple[str, ...] = ()
    error: str | None = None
    fingerprint: str | None = None
    learner: str | None = None

    @property
    def score(self) -> float:
        return round(sum(e.points for e in self.exercises), 4)

    @property
    def max_score(self) -> float:
        return round(sum(e.max_points for e in self.exercises), 4)

    @property
    def runnable_max_score(self) -> float:
        """The maximum over the exercises that could run here (not skipped)."""
        return round(sum(e.max_points for e in self.exercises if e.status != "skipped"), 4)

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "lab": self.lab,
                "learner": self.learner,
                "notebook": self.notebook, "score": self.score, "max_score": self.max_score,
                "runnable_max_score": self.runnable_max_score, "duration_s": self.duration_s,
                "error": self.error, "notes": list(self.notes), "fingerprint": self.fingerprint,
                "environment": asdict(self.environment),
                "exercises": [asdict(e) for e in self.exercises]}

    @classmethod
    def from_dict(cls, data: dict) -> "LabResult":
        if data.get("schema") != SCHEMA or data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"not a {SCHEMA} v{SCHEMA_VERSION} result")
        return cls(lab=data["lab"], notebook=data["notebook"],
                   exercises=tuple(ExerciseResult(**e) for e in data["exercises"]),
                   environment=Environment(**data["environment"]), duration_s=data["duration_s"],
                   notes=tuple(data["notes"]), error=data["error"],
                   fingerprint=data.get("fingerprint"), learner=data.get("learner"))

    def write(self, path: Path) -> None:
        """Write the JSON to ``path`` atomically (an interrupted run leaves no partial file),
        with its ``digest`` under the key of its folder (:func:`results_key`)."""
        data = self.to_dict()
        data["digest"] = digest(data, results_key(path.parent))
        atomic_write(path, json.dumps(data, indent=2) + "\n")


#: the file, in a results folder, holding the key its results' digests are made with
KEY_FILE = ".results-key"


def results_key(folder: Path) -> bytes:
    """The key of the results in ``folder`` (32 random bytes in ``folder/.results-key``, made on
    first use, readable by the grader's user only; kernels never see the folder)."""
    path = folder / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def digest(data: dict, key: bytes) -> str:
    """HMAC-SHA256 (hex) of a result's canonical JSON without its ``digest``: it covers every
    field, the ``fingerprint`` (which digests the hand-in's bytes) among them."""
    body = {k: v for k, v in data.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def read_verified(path: Path) -> LabResult | None:
    """The result at ``path`` when its ``digest`` is right under its folder's key; None when it
    is not a result, or was written or changed by anything but the grader."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        mark = data.get("digest")
        if not isinstance(mark, str) or not (path.parent / KEY_FILE).is_file():
            return None
        if not hmac.compare_digest(mark, digest(data, results_key(path.parent))):
            return None
        return LabResult.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
