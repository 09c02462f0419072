"""Checks: plain callables that judge a learner's answer, with PyTorch as the oracle.

A lab registers its checks in ``labs/<lab>/checks.py`` (a module or package)::

    from grader.checks import CheckFailure, check

    @check("autograd.graph-walk")
    def small_mlp(walk_graph, ctx):
        '''matches torch's own graph on a small MLP'''
        ...                       # raise CheckFailure("what is wrong, what to fix") on a miss

    @check("autograd.graph-walk", hidden=True)
    def random_models(walk_graph, ctx):
        '''matches torch's graph on seeded random models'''
        g = ctx.generator()       # seeded from the run's seed: report it, never hard-code data

A check takes the answer object and a :class:`CheckContext`, returns nothing when the answer is
right, and raises :class:`CheckFailure` (or ``AssertionError``, e.g. from
``torch.testing.assert_close``) with a message a learner can act on when it is wrong. Any other
exception is the answer's own error. :func:`run_checks` runs an exercise's checks (public first,
then hidden, each in the order defined) and returns one :class:`Verdict`; the in-notebook
self-check and the batch grader both call it, so they run the same code in the same order.
Each check runs under a forked global torch RNG seeded with the run's seed (when torch is
loaded), so what it draws (``gradcheck``, ``nn.Linear`` init) is reproducible and the learner's
RNG state is left as it was; and under torch's default global state (:func:`torch_defaults`:
grad mode on, default dtype float32, no mode left active...), whatever the notebook set, which
is given back afterwards. When a check fails and the notebook had changed that state, an
environment variable that steers torch or an entry of its config modules, the message says
which (:meth:`Answer.settings`: :func:`grader.kernel.probe.settings_changes` where the answer
lives, the kernel when grading).
"""
from __future__ import annotations

import importlib
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from grader.kernel import probe as _probe
from grader.kernel.modelled import PROCESSES
from grader.labs import modelled
from grader.kernel.probe import (compiler_caches_as_started, config_changes, plain, probe,
                                  raised, seeded_rng, set_by_hand, started_environ,
                                  state_changes, torch_defaults)
from grader.results import CONTROL

__all__ = ["Answer", "AnswerError", "AnswerRaised", "CheckContext", "CheckFailure", "Verdict",
           "ahead", "check", "checks_for", "compiler_caches_as_started", "config_changes",
           "exact", "paired", "plain", "plain_tensor", "probe", "raised", "run_checks",
           "set_by_hand", "started_environ", "state_changes", "torch_defaults"]

MAX_MESSAGE_CHARS = 1200
#: what an allocation that failed for lack of memory says (Python, torch's CPU allocator, CUDA)
_OOM_MARKS = ("can't allocate memory", "Cannot allocate memory", "out of memory")


def out_of_memory(ename: str, evalue: str) -> bool:
    """Whether an exception (by class name and message) means an allocation ran out of memory."""
    return ename in ("MemoryError", "OutOfMemoryError") or (
        ename == "RuntimeError" and any(m in evalue for m in _OOM_MARKS))


#: what an answer that raised one of these did, or why it fails when graded, in words
_WHY = {
    "SystemExit": "sys.exit() and raise SystemExit end a program; an answer cell must only "
                  "define its answer",
    "KeyboardInterrupt": "as if interrupted from the keyboard; an answer must not raise it",
    "StdinNotImplementedError": "input() waits for a keyboard, and the grader has none: remove "
                                "the call and put the value in your code",
    "FileNotFoundError": "grading runs in an empty folder, so files beside your notebook are "
                         "not there: build the data in your code",
}


def explain(ename: str, evalue: str) -> str:
    """An exception (by class name and message) as a learner reads it: ``ename: evalue``
    (without a closing period, so it ends sentences cleanly), plus why it happened for those
    that mean something particular when graded (``input()``, a missing file, ``sys.exit``)."""
    evalue = evalue.strip().rstrip(".")
    what = f"{ename}: {evalue}" if evalue else ename
    return f"{what} ({_WHY[ename]})" if ename in _WHY else what


class CheckFailure(Exception):
    """The answer is wrong. The message is shown to the learner: say what differs and what to fix;
    never include the check's source or its expected data beyond what the learner needs."""


class AnswerError(Exception):
    """The answer raised (or hung) where the check cannot re-raise its exception with its
    traceback, e.g. in another process: the message says what it raised and where, and the
    verdict is ``error``, as for an exception raised in this process."""


@dataclass(frozen=True)
class CheckContext:
    """What a check may depend on besides the answer: the run's ``seed`` and ``device``
    (``"cpu"`` or ``"cuda"``)."""

    seed: int = 0
    device: str = "cpu"

    def generator(self, offset: int = 0):
        """A CPU ``torch.Generator`` seeded with ``seed + offset`` (pass it to ``torch.randn``)."""
        import torch

        return torch.Generator().manual_seed(self.seed + offset)


@dataclass(frozen=True)
class Check:
    """One registered check: its exercise id, a learner-facing name (the docstring's first line),
    whether it is hidden, and the callable ``fn(answer, ctx) -> None``."""

    exercise: str
    name: str
    hidden: bool
    fn: Callable[[Any, CheckContext], None] = field(repr=False)


_REGISTRY: dict[str, list[Check]] = {}


def check(exercise_id: str, *, hidden: bool = False):
    """Decorator registering ``fn(answer, ctx)`` as a check of ``exercise_id``."""

    def register(fn):
        doc = (fn.__doc__ or fn.__name__).strip().splitlines()[0]
        _REGISTRY.setdefault(exercise_id, []).append(Check(exercise_id, doc, hidden, fn))
        return fn

    return register


#: lab id -> the functions that start, ahead of its checks, work its judges will need
_AHEAD: dict[str, list[Callable[[int], None]]] = {}


def ahead(lab_id: str):
    """Decorator registering ``fn(seed)``: work the judges of ``lab_id`` will need for the run's
    seed (an oracle's run on the seeded cases, seconds of it), which the grader starts in a
    thread of its own as soon as it has the lab's checks, while the kernel still runs the
    notebook (:func:`start_ahead`). It only starts what the checks would compute anyway: it
    holds no verdict and never calls the answer; a check finds that work done or does it. Such
    a function is the grader's only: a learner's copy of the course leaves it out, as it does
    hidden checks (``grader dist student``)."""

    def register(fn):
        _AHEAD.setdefault(lab_id, []).append(fn)
        return fn

    return register


def start_ahead(lab_id: str, seed: int) -> None:
    """Import the checks of ``lab_id`` and call what they registered with :func:`ahead` for
    ``seed``. Raises nothing: what goes wrong here, the checks meet again and report."""
    try:
        importlib.import_module(f"labs.{lab_id}.checks")
        for fn in _AHEAD.get(lab_id, ()):
            fn(seed)
    except Exception:  # (left to the checks, which do the same work again)
        pass


def checks_for(exercise_id: str, *, hidden: bool = True) -> list[Check]:
    """The checks of ``exercise_id``: public ones first, then (if ``hidden``) the hidden ones.

    Imports ``labs.<lab>.checks`` on first use. Raises LookupError when the exercise has none.
    """
    lab = exercise_id.split(".", 1)[0]
    importlib.import_module(f"labs.{lab}.checks")
    registered = _REGISTRY.get(exercise_id)
    if not registered:
        raise LookupError(f"no checks are registered for exercise {exercise_id!r}")
    public = [c for c in registered if not c.hidden]
    return public + ([c for c in registered if c.hidden] if hidden else [])


@dataclass(frozen=True)
class Verdict:
    """The outcome of one exercise's checks.

    ``status`` is ``passed`` (every check passed), ``failed`` (a check found the answer wrong),
    ``error`` (the answer raised, or is missing) or ``crashed`` (it ran out of memory).
    ``passed``/``total`` count the checks run; checks stop at the first miss, so ``passed`` is
    how far the answer got. ``message`` is kept without terminal control sequences
    (:data:`grader.results.CONTROL`).
    """

    exercise: str
    status: str
    message: str
    passed: int
    total: int
    seed: int

    def __post_init__(self):
        object.__setattr__(self, "message", CONTROL.sub("", self.message))

    def to_dict(self) -> dict:
        return asdict(self)


def exact(value: Any, types: type | tuple[type, ...], what: str) -> Any:
    """Return ``value`` when its type is exactly one of ``types``; else raise CheckFailure saying
    ``what`` it is and what was expected. Subclasses are refused on purpose: a subclass can
    override ``__eq__``, ``__bool__``, ``__len__`` or ``__torch_function__`` to lie about its
    contents, so a check that compares values first makes sure they are plain (use
    :func:`plain_tensor` for tensors)."""
    types = types if isinstance(types, tuple) else (types,)
    if type(value) in types:
        return value
    names = " or ".join(t.__name__ for t in types)
    sub = next((t for t in types if isinstance(value, t)), None)
    why = (f"a subclass of {sub.__name__}; return a plain {sub.__name__}" if sub is not None
           else f"not a {names}")
    raise CheckFailure(f"{what} has type {type(value).__name__}, {why}.")


def plain_tensor(value: Any, what: str):
    """Return ``value`` when it is a plain ``torch.Tensor`` (or ``nn.Parameter``); else raise
    CheckFailure. Tensor subclasses (``__torch_function__`` / ``__torch_dispatch__``) can answer
    ``allclose`` and friends with whatever they like, so checks compare plain tensors only."""
    import torch

    return exact(value, (torch.Tensor, torch.nn.Parameter), what)


def _innermost(exc: BaseException):
    """(frame, is_ours) for the innermost traceback frame that is not an installed library's
    (torch, the standard library), where ``is_ours`` says it is the grader's or a lab's checks;
    (None, False) when there is none."""
    import labs

    own = (str(Path(__file__).resolve().parent), *labs.__path__)
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/lib/python" not in frame.filename and frame.filename != _EVALUATED:
            return frame, frame.filename.startswith(own)
    return None, False


#: the file name of code compiled from a string (eval, exec): no line of the cell
_EVALUATED = "<string>"


def learner_line(exc: BaseException) -> str:
    """``" at line N of your cell: `<that line>`"`` when ``exc`` was raised in the learner's
    code, else ``""`` (the line's text is quoted when Python can still read it: a notebook
    shows no line numbers unless the learner turns them on). For check messages that report
    an exception the answer raised."""
    frame, ours = _innermost(exc)
    if not frame or ours:
        return ""
    code = (frame.line or "").strip()
    code = code if len(code) <= 120 else code[:117] + "..."
    inner = [f for f in traceback.extract_tb(exc.__traceback__) if "/lib/python" not in f.filename]
    evaluated = " (in the code that line evaluates)" if inner[-1].filename == _EVALUATED else ""
    return f" at line {frame.lineno} of your cell" + (f": `{code}`" if code else "") + evaluated


def _blame(exc: BaseException, label: str) -> str:
    """Say who raised ``exc``: the learner's code (with its line), or the check while it read the
    answer (then the answer is probably not of the shape the exercise asks for)."""
    what = explain(type(exc).__name__, str(exc))
    frame, ours = _innermost(exc)
    if ours:
        return (f"{label}: checking your answer raised {what}. Does your answer return what "
                "the exercise asks for (type, structure, shapes)?")
    return f"{label}: your answer raised {what}{learner_line(exc)}"


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


def _earlier_stub(exc: NotImplementedError, exercise_id: str) -> bool:
    """Whether ``exc`` is the stub of another exercise of ``exercise_id``'s lab (a later exercise
    can build on an earlier one's answer, e.g. a subclass of its class)."""
    other = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else ""
    lab = exercise_id.split(".", 1)[0]
    return other != exercise_id and other.startswith(f"{lab}.") and other in _REGISTRY


class AnswerRaised(Exception):
    """The learner's answer raised while a probe called it (in the kernel, or in-process).
    ``record`` is the plain record :func:`grader.kernel.probe.raised` made of it: ``ename``,
    ``evalue``, ``where`` and ``ours``. A check may catch it (``exc.ename``) where raising is the
    answer's right behaviour; uncaught, the verdict is ``error`` and says what was raised,
    where."""

    def __init__(self, record: dict):
        self.record = record
        self.ename = str(record.get("ename", "Exception"))
        self.evalue = str(record.get("evalue", ""))
        super().__init__(f"{self.ename}: {self.evalue}")

    def message(self, exercise_id: str, label: str) -> str:
        """What the learner reads (see :func:`_run`)."""
        r = self.record
        lab = exercise_id.split(".", 1)[0]
        if self.ename == "NotImplementedError" and self.evalue == exercise_id:
            return (f"NotImplementedError: {exercise_id} is still the stub. Replace the "
                    f"`raise NotImplementedError(\"{exercise_id}\")` line with your answer.")
        if self.ename == "NotImplementedError" and self.evalue.startswith(f"{lab}."):
            earlier = self.evalue
            return (f"NotImplementedError: {exercise_id} builds on {earlier}, which is still "
                    f"the stub: finish {earlier} first (its check says what is missing).")
        what = explain(self.ename, self.evalue)
        if r.get("ours"):
            return (f"{label}: checking your answer raised {what}. Does your answer return what "
                    "the exercise asks for (type, structure, shapes)?")
        return f"{label}: your answer raised {what}{r.get('where', '')}"


def ran_modelled(record: dict, models: tuple[str, ...]) -> str:
    """What a learner reads when the answer ran the mechanism its exercise models, is that
    mechanism, blinded the profiler, or started a process (``record``:
    :func:`grader.kernel.modelled.observe`'s or :func:`~grader.kernel.modelled.answered_by`'s)."""
    at = f" (line {record.get('line')} of your cell" + (
        f": `{record.get('code')}`)" if record.get("code") else ")")
    kind = record.get("kind")
    if kind == "blind":
        what = "" if record.get("where") == "sys.setprofile" else f" ({record.get('where')})"
        return (f"your answer switched off or went around the profiler the check runs it under"
                f"{what}{at if record.get('line') else ''}: the check cannot see what it ran, "
                "so it does not pass.")
    if kind == "start":
        return (f"your answer started a process ({record.get('where')}){at}: compute the "
                "answer here, in this process, from what you are given; a mechanism run "
                "elsewhere is not one you built.")
    if kind == "course":
        return (f"your answer is {record.get('where')}, the course's own code, not yours: "
                "write the answer in your cell.")
    if kind == "answer":
        return (f"your answer is {record.get('where')}, PyTorch's own code for the mechanism "
                "this exercise asks you to model (or built on it): write your own.")
    return (f"your answer ran {record.get('where')}{at}: that is PyTorch's own code for the "
            "mechanism this exercise asks you to model (it runs none of "
            f"{', '.join(m for m in models if m != PROCESSES)}). Compute the answer yourself "
            "from what you are given.")


class Answer:
    """The learner's answer as a judge sees it: a handle, never the object. ``answer(*args,
    **kwargs)`` calls it on plain data and returns plain data (see :mod:`grader.kernel.probe`);
    ``answer.probe(fn, *args)`` runs the lab's probe ``fn`` (``labs/<lab>/probes.py``) on it.
    Either raises :class:`AnswerRaised` when the answer raised, and :class:`CheckFailure` when
    what came back is not plain data. Subclasses say where the answer lives (:meth:`send`):
    :class:`LocalAnswer` in this process (a self-check, a test), the grader's in the learner's
    kernel (``grader.judge.execute``)."""

    def __init__(self, exercise_id: str, seed: int = 0):
        self.exercise, self.seed = exercise_id, seed
        self.models = modelled(exercise_id)

    def __call__(self, *args, **kwargs) -> Any:
        return self._reply(None, args, kwargs)

    def probe(self, fn: Callable, *args, **kwargs) -> Any:
        """``fn(answer, *args, **kwargs)`` where the answer lives, as plain data."""
        return self._reply(_probe.name_of(fn), args, kwargs)

    def send(self, probe_name: str | None, args: tuple, kwargs: dict) -> bytes:
        """The encoded reply of :func:`grader.kernel.probe.call` for this call."""
        raise NotImplementedError

    def settings(self) -> list[str]:
        """How the settings where the answer lives differ from torch's defaults and from the
        environment its process started with, in words
        (:func:`grader.kernel.probe.settings_changes`); empty when they do not, or cannot be
        read (at most 8 entries of 200 characters)."""
        try:
            found = self._reply(_probe.SETTINGS, (), {})
        except ProbeLost:
            raise  # (the kernel timed out or died: the engine reports it)
        except Exception:  # noqa: BLE001  (whatever came back, the verdict stands without it)
            return []
        return [s[:200] for s in found if type(s) is str][:8] if type(found) is list else []

    def _reply(self, probe_name: str | None, args: tuple, kwargs: dict) -> Any:
        if why := _probe.plain((list(args), kwargs), "the probe's inputs"):
            raise TypeError(f"a check passed data that is not plain to the answer: {why}")
        try:
            reply = _probe.decode(self.send(probe_name, args, kwargs))
        except ValueError as exc:
            raise CheckFailure(f"what came back from your answer is not plain data: {exc}.")
        if type(reply) is not dict:
            raise CheckFailure("what came back from your answer is not a probe's reply.")
        if "value" in reply:
            return reply["value"]
        if "raised" in reply and type(reply["raised"]) is dict:
            raise AnswerRaised(reply["raised"])
        if "unplain" in reply:
            raise CheckFailure(f"{reply['unplain']}.")
        if "modelled" in reply and type(reply["modelled"]) is dict:
            raise CheckFailure(ran_modelled(reply["modelled"], self.models))
        if "missing" in reply:
            raise AnswerMissing(str(reply["missing"]))
        raise CheckFailure("what came back from your answer is not a probe's reply.")


class AnswerMissing(Exception):
    """The notebook binds no answer under the exercise's name."""


class LocalAnswer(Answer):
    """An answer object of this process behind the same plain-data boundary as the kernel's:
    what the in-notebook self-check and the tests judge."""

    def __init__(self, obj: Any, exercise_id: str, seed: int = 0):
        super().__init__(exercise_id, seed)
        self._obj = obj

    def send(self, probe_name, args, kwargs) -> bytes:
        args, kwargs = _probe.decode(_probe.encode((list(args), kwargs)))
        return _probe.call(self._obj, probe_name, tuple(args), kwargs, self.seed, self.models)


def paired(asked: list, reply: Any, what: str) -> list[tuple]:
    """``list(zip(asked, reply))`` when ``reply`` (what came back from a probe) is a list with
    one entry per case ``asked``, or fewer ending with a ``{"raised": record}`` entry (the
    probe stopped where the answer raised); else CheckFailure. A judge pairs its cases with a
    reply through this: a kernel can send back any plain data, and a reply that covers fewer
    cases must not pass them."""
    stopped = (type(reply) is list and 0 < len(reply) <= len(asked)
               and type(reply[-1]) is dict and "raised" in reply[-1])
    if not stopped and (type(reply) is not list or len(reply) != len(asked)):
        n = len(reply) if type(reply) is list else type(reply).__name__
        raise CheckFailure(f"what came back from your answer covers {n} of the {len(asked)} "
                           f"{what} the check asked about: the grader's probe did not run as "
                           "shipped (answers must not modify the grader).")
    return list(zip(asked, reply))


def run_checks(exercise_id: str, answer: Any, *, seed: int = 0, device: str = "cpu",
               hidden: bool = True) -> Verdict:
    """Run the checks of ``exercise_id`` on ``answer`` and return a Verdict; never raises for a
    wrong or broken answer (only for a lab with no checks: LookupError). ``answer`` is an
    :class:`Answer` handle, or the answer object itself, which is then judged through a
    :class:`LocalAnswer`.
    Without ``hidden`` (the learner's self-check) only the public checks run, numbered as the
    grader numbers them: "check 2/6" is the same check in the notebook and in the grader's
    report."""
    checks = checks_for(exercise_id, hidden=True)
    if not isinstance(answer, Answer):
        answer = LocalAnswer(answer, exercise_id, seed)
    with torch_defaults():
        v = _run(exercise_id, checks, answer, seed, device, hidden)
    stub = v.message.startswith("NotImplementedError:")  # (no answer yet: nothing to note)
    if v.status != "passed" and not stub and (changed := answer.settings()):
        listed = "; ".join(changed)
        listed = listed if len(listed) <= 600 else listed[:597] + "..."
        note = (f" Note: your notebook changed settings ({listed}). What the checks "
                "run themselves ran under torch's defaults and the environment your kernel "
                "started with, but your cells ran under these: if your answer depends on one, "
                "undo it (or use a `with` block).")
        text = v.message[: MAX_MESSAGE_CHARS - len(note) - 3].rstrip()
        text += "..." if len(text) < len(v.message) else ""
        v = Verdict(v.exercise, v.status, text + note, v.passed, v.total, v.seed)
    return v


def _withheld(exercise_id: str) -> int:
    """How many hidden checks of ``exercise_id`` this copy of the course does not have (the lab
    table's ``withheld``: a learner's copy), which are still counted: checks are numbered as
    the instructor's grader numbers them ("check 2/6"), and a pass says how many it still
    runs."""
    from grader.errors import GraderError
    from grader.labs import load_lab

    try:
        return load_lab(exercise_id.split(".", 1)[0]).exercise(exercise_id).withheld
    except GraderError:  # checks of an exercise the lab table does not list
        return 0


def _run(exercise_id: str, every: list[Check], answer: Any, seed: int, device: str,
         hidden: bool) -> Verdict:
    ctx = CheckContext(seed=seed, device=device)
    checks = every if hidden else [c for c in every if not c.hidden]
    total = len(every) + _withheld(exercise_id)
    for done, chk in enumerate(checks):
        label = (f"{'hidden ' if chk.hidden else ''}check {done + 1}/{total} "
                 f"'{chk.name}' (seed {seed})")

        def verdict(status: str, message: str) -> Verdict:
            return Verdict(exercise_id, status, _clip(message), done, len(checks), seed)

        try:
            with seeded_rng(seed):
                chk.fn(answer, ctx)
        except (CheckFailure, AssertionError) as exc:
            return verdict("failed", f"{label} failed: {exc}")
        except AnswerError as exc:
            return verdict("error", f"{label}: {exc}")
        except AnswerMissing as exc:
            return verdict("error", f"`{exc}` is not defined: the answer cell of {exercise_id} "
                           "is missing or raised before defining it.")
        except AnswerRaised as exc:
            if out_of_memory(exc.ename, exc.evalue):
                return verdict("crashed", f"{label}: out of memory: your answer tried to allocate "
                               f"more memory than the grader allows ({exc})")
            return verdict("error", exc.message(exercise_id, label))
        except ProbeLost:
            raise  # the kernel timed out or died under a probe: the engine reports it
        except Exception as exc:  # reported without the check's source
            if out_of_memory(type(exc).__name__, str(exc)):
                return verdict("crashed", f"{label}: out of memory: your answer tried to "
                               f"allocate more memory than the grader allows "
                               f"({type(exc).__name__}: {exc})")
            if isinstance(exc, NotImplementedError) and exc.args == (exercise_id,):
                msg = (f"NotImplementedError: {exercise_id} is still the stub. Replace the "
                       f"`raise NotImplementedError(\"{exercise_id}\")` line with your answer.")
            elif isinstance(exc, NotImplementedError) and _earlier_stub(exc, exercise_id):
                msg = (f"NotImplementedError: {exercise_id} builds on {exc.args[0]}, which is "
                       f"still the stub: finish {exc.args[0]} first (its check says what is "
                       "missing).")
            else:
                msg = _blame(exc, label)
            return verdict("error", msg)
    n = len(checks)
    which = "checks" if any(c.hidden for c in checks) else "public checks"
    message = (f"{n}/{n} checks passed (seed {seed})" if n == total else
               f"{n}/{n} {which} passed (seed {seed}); the grader also runs "
               f"{total - n} hidden check(s) on other inputs")
    return Verdict(exercise_id, "passed", message, n, n, seed)


class ProbeLost(Exception):
    """A probe could not finish in the learner's kernel (it hit the exercise's time limit, or
    the kernel died): grading of the exercise stops, and the engine reports why."""
