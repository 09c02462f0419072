"""Hostile and broken submissions, generated from the released notebooks so they stay in step
with the labs.

Each :class:`Fixture` starts from a *perfect submission* (the released notebook with the
reference answers pasted into its answer cells, as a learner who solved everything would hand
in) and applies one small mutation: a fault, a cheat or a break. ``expect`` maps the affected
exercises to the status and a phrase of the message they must get; every other exercise must
score as the reference does (``passed``).

``python tests/hostile/catalogue.py OUT`` writes every fixture to ``OUT`` (to grade by hand).
"""
from __future__ import annotations

import copy
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import nbformat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from grader import notebook  # noqa: E402
from grader.labs import load_lab  # noqa: E402
from grader.judge.execute import VERDICT_MIME  # noqa: E402

#: a value planted in the grader's environment; no submission may see it
SECRET_ENV = ("GRADER_HOSTILE_SECRET", "hunter2-not-for-learners")


@dataclass(frozen=True)
class Fixture:
    """One submission: ``build(perfect notebook) -> notebook or raw bytes``; ``expect`` maps
    exercise slugs to ``(status, phrase)``; ``notes`` are phrases the result's notes must hold;
    ``timeout`` overrides every exercise's limit (s); ``path`` is where it is written, relative
    to the batch folder; ``error`` is a phrase of the result's ``error`` (ungradable notebooks);
    ``clean``: the result has no notes (nothing needed repair)."""

    name: str
    kind: str
    lab: str
    build: Callable
    expect: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    timeout: float | None = None
    path: str = ""
    error: str = ""
    result_lab: str = ""
    clean: bool = False

    @property
    def relpath(self) -> str:
        return self.path or f"{self.name}/{load_lab(self.lab).notebook}.ipynb"


# ------------------------------------------------------------------ building blocks
def perfect(lab_id: str):
    """The released notebook of ``lab_id`` with the reference answers in its answer cells."""
    lab = load_lab(lab_id)
    release = notebook.read(lab.release_path)
    solution = notebook.read(lab.root / "solutions" / f"{lab.notebook}.ipynb")
    reference = {c.id: c.source for c in solution.cells if notebook.role(c) == "answer"}
    for cell in release.cells:
        if notebook.role(cell) == "answer":
            cell.source = reference[cell.id]
    return release


def answer(nb, lab: str, slug: str):
    """The (first) answer cell of ``<lab>.<slug>``."""
    return next(c for c in nb.cells if notebook.exercise_of(c) == f"{lab}.{slug}"
                and notebook.role(c) == "answer")


def name_of(lab: str, slug: str) -> str:
    return load_lab(lab).exercise(f"{lab}.{slug}").answer


def before(lab: str, slug: str, code: str):
    """Mutation: ``code`` runs at the top of the exercise's answer cell."""
    def build(nb):
        cell = answer(nb, lab, slug)
        cell.source = code + "\n" + cell.source
        return nb
    return build


def after(lab: str, slug: str, code: str):
    """Mutation: ``code`` runs after the exercise's reference answer (``{name}`` is its name)."""
    def build(nb):
        cell = answer(nb, lab, slug)
        cell.source += "\n" + code.replace("{name}", name_of(lab, slug))
        return nb
    return build


def chain(*steps):
    def build(nb):
        for step in steps:
            nb = step(nb)
        return nb
    return build


def stub(lab: str, slug: str):
    """Mutation: the exercise's answer cell is back to the released stub."""
    def build(nb):
        release = notebook.read(load_lab(lab).release_path)
        answer(nb, lab, slug).source = answer(release, lab, slug).source
        return nb
    return build


def raw(data: bytes):
    return lambda nb: data


def _edit_release_cells(nb):
    setup = next(c for c in nb.cells if notebook.role(c) == "setup")
    setup.source += "\ntorch.allclose = lambda *a, **k: True  # the learner's 'fix'"
    check = next(c for c in nb.cells if notebook.role(c) == "check"
                 and notebook.exercise_of(c) == "autograd.engine")
    markdown = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]
    nb.cells[markdown[1]], nb.cells[markdown[2]] = nb.cells[markdown[2]], nb.cells[markdown[1]]
    nb.cells = [c for c in nb.cells if c is not check and c is not nb.cells[markdown[3]]]
    return nb


def _relabel_answer(nb):
    answer(nb, "autograd", "engine").metadata["course"]["exercise"] = "autograd.graph-walk"
    answer(nb, "autograd", "checkpoint").metadata["course"]["exercise"] = "autograd.bogus"
    return nb


def _duplicate_answer(nb):
    cell = answer(nb, "autograd", "engine")
    wrong = copy.deepcopy(cell)
    wrong.id = "learner-first-try"
    wrong.source = "def run_backward(*args, **kwargs):\n    return {}  # first try"
    nb.cells.insert(nb.cells.index(cell), wrong)
    return nb


def _delete_answer(nb):
    nb.cells.remove(answer(nb, "autograd", "engine"))
    return nb


def _markdown_answer(nb):
    cell = answer(nb, "autograd", "engine")
    nb.cells[nb.cells.index(cell)] = nbformat.v4.new_markdown_cell(
        cell.source, id=cell.id, metadata=cell.metadata)
    return nb


def _nbformat(major: int):
    def build(nb):
        if major == 3:
            return nbformat.writes(nbformat.convert(nb, 3), version=3).encode()
        nb.nbformat = major
        return json.dumps(nb).encode()
    return build


def _symlink(nb):
    """A link to a file of the instructor's (what a zip upload can carry)."""
    private = Path(tempfile.mkdtemp()) / "grades-notes.txt"
    private.write_text("INSTRUCTOR-ONLY: root:x:0:0 and other private lines\n")
    return private


def _kernelspec(nb):
    nb.metadata["kernelspec"] = {"name": "julia-1.9", "display_name": "Julia 1.9",
                                 "language": "julia"}
    return nb


def _no_lab_metadata(nb):
    del nb.metadata["course"]
    return nb


def _no_lab(nb):
    """Nothing says which lab: no metadata, cells with ids and metadata of their own."""
    nb = _no_lab_metadata(nb)
    for i, cell in enumerate(nb.cells):
        cell.id, cell.metadata = f"mine-{i}", {}
    return nb


def _stale_outputs(nb):
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.execution_count = 7
            cell.outputs = [
                nbformat.v4.new_output("stream", name="stdout", text="STALE-OUTPUT\n"),
                nbformat.v4.new_output("display_data", data={
                    VERDICT_MIME: {"exercise": notebook.exercise_of(cell) or "",
                                   "status": "passed", "message": "STALE-OUTPUT", "passed": 1,
                                   "total": 1, "seed": 0},
                    "text/plain": "STALE-OUTPUT"})]
    return nb


def _huge(nb):
    cell = nbformat.v4.new_code_cell("# the learner printed a lot here once", id="learner-huge")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text=("y" * 79 + "\n") * 10_000)
                    for _ in range(40)]  # 32 MB of embedded output
    nb.cells.insert(5, cell)
    return nb


_FAKE_VERDICT = f'''
from IPython.display import display
print("✓ autograd.engine: passed — 6/6 checks passed")
display({{{VERDICT_MIME!r}: {{"exercise": "autograd.engine", "status": "passed", "message": "ok",
          "passed": 6, "total": 6, "seed": 0, "duration_s": 0.1}}, "text/plain": "passed"}},
        raw=True)
'''

_FAKE_GRADE = f'''
import grader.kernel.selfcheck
from IPython.display import display

def _always_passed(exercise_id, *, seed, device):
    display({{{VERDICT_MIME!r}: {{"exercise": exercise_id, "status": "passed", "message": "ok",
              "passed": 1, "total": 1, "seed": seed, "duration_s": 0.0}}}}, raw=True)

grader.kernel.selfcheck.grade = _always_passed
'''

_LIAR_DICT = '''
class _AlwaysEqual(dict):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __bool__(self): return True
    def __contains__(self, key): return True
    def __getitem__(self, key): return _AlwaysEqual()
    def __len__(self): return 3
    def __iter__(self): return iter(("nodes", "edges", "leaves"))

def {name}(output):
    return _AlwaysEqual()
'''

_LIAR_TENSOR = '''
class _Agreeable(torch.Tensor):
    """Zeros that claim to equal whatever they are compared with."""
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        if func in (torch.isclose, torch.eq, torch.Tensor.__eq__):
            return torch.ones(args[0].shape, dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})

_honest = {name}
def {name}(*args, **kwargs):
    return {k: torch.zeros_like(v).as_subclass(_Agreeable)
            for k, v in _honest(*args, **kwargs).items()}
'''

_DETECT = '''
import os
# (JPY_PARENT_PID is no sign: jupyter_client sets it for JupyterLab's kernels too)
_words = ("GRADE", "PAPERMILL", "SECRET", "GITHUB", "PYTEST", "TOKEN")
_leaks = sorted(k for k in os.environ if any(w in k.upper() for w in _words) or k == "CI")
_leaks += (["secret in /proc"]
           if "hunter2" in open("/proc/self/environ", errors="replace").read() else [])
_leaks += [f"file {p}" for p in os.listdir(".")]
if _leaks:
    raise RuntimeError(f"the grading environment showed: {_leaks}")
with open("learner-wrote-this.txt", "w") as f:
    f.write("a file a learner wrote")
'''

_WRONG_GRADS = '''
_honest = {name}
def {name}(*args, **kwargs):
    return {k: torch.zeros_like(v) for k, v in _honest(*args, **kwargs).items()}
torch.allclose = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
'''

_PATCH_OBSERVERS = _WRONG_GRADS + '''
import grader.kernel.probe, grader.kernel.strays
grader.kernel.strays.strays = lambda: ([], [])
grader.kernel.strays.describe = lambda when: ""
grader.kernel.probe.state_changes = lambda: []
'''

_PATCH_TORCH_INTERNALS = '''
_honest = {name}
def {name}(*args, **kwargs):
    return {k: torch.zeros_like(v) for k, v in _honest(*args, **kwargs).items()}
import torch.testing._comparison as _comparison
_comparison.TensorLikePair.compare = lambda self: None
_comparison.not_close_error_metas = lambda *args, **kwargs: []
'''

_PATCH_RUN_CHECKS = '''
import grader.kernel.selfcheck, grader.checks
grader.kernel.selfcheck.run_checks = lambda ex, answer, **kw: grader.checks.Verdict(
    ex, "passed", "all good", 1, 1, kw.get("seed", 0))
'''

def learner_cell(after_role: str, code: str, exercise: str | None = None):
    """Mutation: a cell the learner added, with ``code``, right after the (first) cell of
    ``after_role`` (and ``exercise``)."""
    def build(nb):
        at = next(i for i, c in enumerate(nb.cells) if notebook.role(c) == after_role
                  and (exercise is None or notebook.exercise_of(c) == exercise))
        nb.cells.insert(at + 1, nbformat.v4.new_code_cell(code, id=f"learner-{after_role}-{at}"))
        return nb
    return build


def _crlf(nb):
    """What an editor on Windows saves: every cell's lines end in CR LF."""
    for cell in nb.cells:
        cell.source = cell.source.replace("\n", "\r\n")
    return nb


def _without_ids(nb):
    """nbformat 4.4, as older editors save: no cell ids."""
    data = json.loads(nbformat.writes(nb, version=4))
    data["nbformat_minor"] = 4
    for cell in data["cells"]:
        cell.pop("id", None)
    return json.dumps(data, indent=1).encode()


def _bom(nb):
    return b"\xef\xbb\xbf" + nbformat.writes(nb, version=4).encode()


def _drop_cell_metadata(nb):
    """An editor that keeps cell ids but drops every cell's metadata (and the notebook's)."""
    for cell in nb.cells:
        cell.metadata = {}
    nb.metadata = {"kernelspec": nb.metadata["kernelspec"]}
    return nb


_LEARNER_IO = {
    "views": "name = input('Your name? ')",
    "op-trace": "rows = open('data.csv').read().splitlines()",
}


# lab 3: an answer that has the lab's own model (the checks' oracle) read the snapshot, and a
# snapshot() that says yes to every comparison (the allocator classes of exercises 3 and 4
# inherit it)
_ORACLE_ANSWER = ("from labs.allocator import traces as _traces\n"
                  "{name} = lambda snapshot: _traces.recorded_oom('fragmented')[1]")
_LYING_SNAPSHOT = ("class _Yes(list):\n    def __eq__(self, other):\n        return True\n\n\n"
                   "_honest_snapshot = {name}.snapshot\n"
                   "{name}.snapshot = lambda self: _Yes(_honest_snapshot(self))")

# lab 4: compiler state a submission can leave behind. Dynamo's config changed so that `.item()`
# no longer breaks a graph (the checks judge under the defaults), and Inductor's on-disk cache
# poisoned: junk over every artifact the notebook's earlier compiles left there, and a planted
# FX graph cache entry. The cache is the submission's own (one per run), and the fusion check
# compiles with the FX graph cache off: the poison costs nothing, and reaches no one else.
_CONFIG_CHEAT = ("torch._dynamo.config.capture_scalar_outputs = True\n"
                 "{name}['item'] = programs.item")
_POISON_CACHE = """\
from pathlib import Path
from torch._inductor.runtime.cache_dir_utils import cache_dir
_cache = Path(cache_dir())
print("POISONED-CACHE", _cache)
for _path in [p for p in _cache.rglob("*")
              if p.is_file() and "precompiled_headers" not in p.parts]:
    _path.write_bytes(b"poisoned by a submission")
(_cache / "fxgraph" / "zz").mkdir(parents=True, exist_ok=True)
(_cache / "fxgraph" / "zz" / "planted").write_bytes(b"poisoned by a submission")
"""

# lab 7: libraries planted in the extensions folder. Every library the run built (the lab's own
# operators) is replaced by junk under its name, with the marker that says "built", so that a
# kernel loading it from that folder would fail; the folder is the run's own (one per run, in
# its temporary folder, outside the warm cache) and goes with it: no other hand-in loads from it.
_PLANT_EXTENSIONS = """\
import os
from labs.extensions import build as _build
_root = _build.root()
print("PLANTED-EXTENSIONS", _root)
for _library in _root.glob("*/*.so"):
    _junk = _library.with_suffix(".junk")
    _junk.write_bytes(b"planted by a submission")
    os.replace(_junk, _library)  # (a new file: the loaded library's pages stay as they were)
    (_library.parent / "built").write_text("")
"""

# lab 5: ranks that misbehave. Rank 1 sleeps in the ring (the others wait for its message; only
# on the check's 12 elements, not the demo's 10, so that the fixture waits once), rank 1
# of MiniDDP's ranks exits as it is built, and a process group is initialized in the kernel
# itself, where every rank forked from it would inherit it. Each costs its own exercise only.
_HANGING_RANK = ("_honest = {name}\n\n\ndef {name}(tensor):\n"
                 "    if dist.get_rank() == 1 and tensor.numel() == 12:\n"
                 "        import time\n        time.sleep(3600)\n    _honest(tensor)")
_EXITING_RANK = ("class _Leaving({name}):\n    def __init__(self, *args, **kwargs):\n"
                 "        if dist.get_rank() == 1:\n"
                 "            import os\n            os._exit(0)\n"
                 "        super().__init__(*args, **kwargs)\n\n\n{name} = _Leaving")
_LEAKED_GROUP = 'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)'

# export lab: a prediction that exports after all, through the name the setup cell imported
# (`export`, bound before the check switched export off); and an interpreter that returns zeros,
# with ExportedProgram.module (the check's oracle) replaced to run that same interpreter
_EXPORTS_ANYWAY = '''
def {name}(model, args):
    sig = export(model, args).run_decompositions().graph_signature
    return {{"inputs": [(s.kind.name, s.arg.name if s.kind.name == "USER_INPUT" else s.target)
                       for s in sig.input_specs],
            "outputs": [(s.kind.name, s.target) for s in sig.output_specs]}}
'''
_ORACLE_IS_ME = '''
def {name}(ep, *args):
    return tuple(torch.zeros_like(n.meta["val"]) for n in ep.graph.output_node().args[0][-1:])
torch.export.ExportedProgram.module = lambda self, **kw: (lambda *args: {name}(self, *args))
'''

#: what per-sample-grads's judge says of the wrong (all-zero) gradients above
_PER_SAMPLE_MISS = "check 1/4 'matches a per-example torch.autograd.grad loop"

# lab 8: a loader that hangs with a worker left running, and answers that borrow a mechanism
# (the course's own helper that runs the real hooks; nn.Module through __mro_entries__)
_HANGING_LOADER = """
import multiprocessing as _mp
import time as _time


class {name}:
    def __init__(self, dataset, **kwargs):
        self.dataset = dataset

    def __len__(self):
        return 1

    def __iter__(self):
        _mp.get_context("fork").Process(target=_time.sleep, args=(600,)).start()
        while True:  # waits for a batch no worker sends
            _time.sleep(0.05)
"""
_BORROWED_HOOKS = """
import functools
from labs.modules import probes as _probes
{name} = functools.partial(_probes.traced_run, seed=0)
"""
_MODULE_BY_MRO_ENTRIES = """
class _Borrowed:
    __name__ = "Module"

    def __mro_entries__(self, bases):
        return (torch.nn.Module,)


{name} = _Borrowed()
"""

_ESCAPING_RUN = '''
_honest_nan = {name}

_DAEMON = """

import os as _os
import time as _time

_case_main = main


def main(config):
    if _os.fork() == 0:  # a session of its own: out of the run's process group
        _os.setsid()
        _time.sleep(600)
        _os._exit(0)
    return _case_main(config)
"""


def {name}(case):
    reply = _honest_nan(case)
    reply["script"] += _DAEMON
    return reply
'''
_KILLS_THE_KERNEL = '''
def {name}(case):
    kill = "\\nimport os, signal\\nos.kill(os.getppid(), signal.SIGKILL)  # the kernel\\n"
    return {"diagnosis": {}, "script": case.source + kill}
'''
_EXITS_AT_ONCE = '''
_honest_hang = {name}


def {name}(case):
    reply = _honest_hang(case)  # (the right diagnosis, and a script that ends before main)
    reply["script"] = "import os\\n\\ndef main(config):\\n    os._exit(0)\\n"
    return reply
'''
_A_LIST = '''
def {name}(case):
    return [case.source]
'''

#: the compile lab's exercises the compile-state fixture leaves as stubs (they compile most)
_COMPILE_STUBS = ("partitioner", "fusion", "mini-dynamo", "dynamic-shapes")

# ------------------------------------------------------------------ the catalogue
A, D, L, C, N, X = "autograd", "dispatcher", "allocator", "compile", "distributed", "export"
E, M, P = "extensions", "modules", "production"

FIXTURES = [
    # execution faults (fixtures whose faults cannot interfere share a notebook: each fault is
    # in another exercise, and what one changes for the rest of the notebook (a fresh kernel
    # after a crash, a patch in the last exercise) reaches no other fault's exercise)
    Fixture("time-limits", "infinite loops: one without output (in one answer cell), one with "
            "output (in another)", A,
            chain(before(A, "engine", "while True:\n    pass"),
                  before(A, "checkpoint",
                         "import itertools\nfor i in itertools.count():\n    print('spam', i)")),
            {"engine": ("timeout", "exceeded the time limit of 10 s while running your answer"),
             "checkpoint": ("timeout", "exceeded the time limit of 10 s")},
            timeout=10),
    # every fault here kills the kernel: each exercise after one is graded in a fresh kernel
    Fixture("kernel-deaths-and-memory", "the kernel dies: memory blown when the answer is "
            "checked, os._exit(1), a segfault, SIGKILL to itself, memory blown in an answer "
            "cell", A,
            chain(after(A, "graph-walk", "_honest = {name}\ndef {name}(output):\n"
                        "    torch.empty(1 << 42)\n    return _honest(output)"),
                  before(A, "engine", "import os\nos._exit(1)"),
                  before(A, "custom-function", "import ctypes\nctypes.string_at(0)"),
                  before(A, "saved-tensor-hooks",
                         "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"),
                  before(A, "per-sample-grads",
                         "hog = []\nwhile True:\n    hog.append(torch.ones(1 << 24))")),
            {"graph-walk": ("crashed", "out of memory"),
             "engine": ("crashed", "exited with status 1"),
             "custom-function": ("crashed", "segmentation fault"),
             "saved-tensor-hooks": ("crashed", "killed (SIGKILL)"),
             "per-sample-grads": ("crashed", "out of memory while running your answer: the kernel "
                                  "may use at most 4 GiB")}),
    # the interpreter killed in the first exercise; the flood after it, in a fresh kernel
    Fixture("recursion-crash-and-output-flood", "recursion deep enough to kill the interpreter, "
            "then an output flood: 300k lines, and one 50 MB line", A,
            chain(before(A, "graph-walk", "import sys\nsys.setrecursionlimit(10**9)\n"
                         "def deep(n):  # through C (sorted) on every level: the C stack "
                         "overflows\n    return sorted([0], key=lambda _: deep(n + 1))\n"
                         "deep(0)"),
                  before(A, "engine", "for i in range(300_000):\n    print(i)"),
                  before(A, "checkpoint", "print('x' * 50_000_000)")),
            {"graph-walk": ("crashed", "the kernel died while running your answer")},
            clean=True),
    Fixture("exits-recursion-and-patched-grader", "sys.exit(0), sys.exit(1), raise SystemExit, "
            "raise KeyboardInterrupt; deep recursion (RecursionError); then the grader's "
            "run_checks replaced from the last answer, left the stub", D,
            chain(before(D, "views", "import sys\nsys.exit(0)"),
                  before(D, "op-trace", "import sys\nsys.exit(1)"),
                  before(D, "key-priority", "raise SystemExit"),
                  before(D, "custom-op", "raise KeyboardInterrupt"),
                  after(D, "functionalize", "def {name}(*args, **kwargs):\n"
                        "    return {name}(*args, **kwargs)"),
                  stub(D, "privateuse1"), after(D, "privateuse1", _PATCH_RUN_CHECKS)),
            # (privateuse1 is judged by the grader: the kernel's run_checks decides nothing, so
            # the stub is reported as the stub)
            {"functionalize": ("error", "RecursionError"),
             "privateuse1": ("error", "dispatcher.privateuse1 is still the stub"),
             "views": ("error", "raised SystemExit: 0 (sys.exit() and raise SystemExit end a "
                       "program"),
             "op-trace": ("error", "raised SystemExit: 1 (sys.exit() and raise SystemExit end"),
             "key-priority": ("error", "raised SystemExit (sys.exit() and raise SystemExit end"),
             "custom-op": ("error", "raised KeyboardInterrupt (as if interrupted from the "
                           "keyboard")}),
    # no kernel dies after the strays: a fresh kernel would replay (restart) them
    Fixture("strays-and-hidden-traceback", "a thread left running after one answer cell; child "
            "processes after another, one of them detached (setsid); then showtraceback "
            "overridden to hide an error", A,
            chain(after(A, "graph-walk", "import threading, time\nthreading.Thread("
                        "target=time.sleep, args=(3600,), name='spinner', daemon=True).start()"),
                  after(A, "engine", "import subprocess\n_child = subprocess.Popen(['sleep', "
                        "'3607'])\nsubprocess.run('setsid sleep 3608 &', shell=True)"),
                  before(A, "custom-function",
                         "get_ipython().showtraceback = lambda *a, **k: None\n"
                         "get_ipython()._showtraceback = lambda *a, **k: None\n1 / 0")),
            {"graph-walk": ("error", "left 1 thread(s) running ('spinner')"),
             "engine": ("error", "left 2 child process(es) running (pid"),
             "custom-function": ("error", "ZeroDivisionError: division by zero")}),
    # cheating and tampering (what patches torch or the grader does so in the last exercise,
    # after the other fault of its notebook has been graded)
    Fixture("lying-results-and-stale-verdicts", "an answer whose result says yes to every "
            "comparison, the expected verdict written into a stub's output, a tensor subclass "
            "that lies about its values, and stale outputs (passing verdicts) in every cell", A,
            chain(after(A, "graph-walk", _LIAR_DICT),
                  stub(A, "engine"), after(A, "engine", _FAKE_VERDICT),
                  after(A, "per-sample-grads", _LIAR_TENSOR), _stale_outputs),
            {"graph-walk": ("failed", "subclass"), "per-sample-grads": ("failed", "subclass"),
             "engine": ("error", "autograd.engine is still the stub")}),
    Fixture("detects-grading-and-patched-torch", "reads the environment and files to detect "
            "grading; then torch.allclose / assert_close patched to pass wrong answers", A,
            chain(before(A, "engine", _DETECT), after(A, "per-sample-grads", _WRONG_GRADS)),
            # (judged by the grader: the kernel's patched torch decides nothing, so the wrong
            # answer fails and forward-ad, after the patch, passes)
            {"per-sample-grads": ("failed", _PER_SAMPLE_MISS)},
            clean=True),
    Fixture("answer-deleted-and-patched-torch-internals", "an answer cell deleted; what "
            "assert_close runs patched (no grader knowledge)", A,
            chain(_delete_answer, after(A, "per-sample-grads", _PATCH_TORCH_INTERNALS)),
            {"engine": ("error", "No answer cell for autograd.engine was found"),
             "per-sample-grads": ("failed", _PER_SAMPLE_MISS)}),
    Fixture("oracle-answer-and-lying-snapshot", "an allocator whose snapshot equals everything, "
            "and an answer that returns the reference model's recorded answer for the "
            "notebook's example", L,
            chain(after(L, "best-fit-split", _LYING_SNAPSHOT),
                  after(L, "oom-forensics", _ORACLE_ANSWER)),
            {"oom-forensics": ("failed", "on the public random OOM, 'oom_request' is")}
            | {slug: ("failed", "a subclass of list")
               for slug in ("best-fit-split", "coalesce", "streams")}),
    Fixture("compile-state", "Dynamo's config changed and Inductor's cache poisoned", C,
            # (poisoned in a cell of the learner's after the last exercise is judged: the
            # kernel's own compiled code lives in that cache, mapped into memory, so a cache
            # poisoned before would cost the exercises judged after it or not, as chance has
            # it (a SIGBUS when a page of a truncated file is touched); what is tested is that
            # the cache is the run's own. The exercises that compile most left as stubs: CI
            # time)
            chain(after(C, "graph-breaks", _CONFIG_CHEAT),
                  *(stub(C, slug) for slug in _COMPILE_STUBS),
                  learner_cell("check", _POISON_CACHE, "compile.dynamic-shapes")),
            {"graph-breaks": ("failed", "item"),
             **{slug: ("error", f"compile.{slug} is still the stub") for slug in _COMPILE_STUBS}}),
    # (package_aoti left as the stub, so that the timing cell does not compile: CI time)
    Fixture("export-oracles", "a signature predicted by exporting after all; an interpreter that "
            "returns zeros, with the checks' oracle (ExportedProgram.module) made to agree", X,
            chain(after(X, "signature", _EXPORTS_ANYWAY),
                  after(X, "mini-interpreter", _ORACLE_IS_ME), stub(X, "aoti")),
            {"signature": ("failed", "your answer ran torch/export/"),
             # (judged: the kernel's patched ExportedProgram.module breaks what runs there,
             # which costs those exercises; aoti is the stub)
             "mini-interpreter": ("error", "checking your answer raised AttributeError"),
             "onnx-parity": ("error", "your answer raised"),
             "aoti": ("error", "export.aoti is still the stub")}),
    # (the C++ exercises left as stubs, so that grading builds only the lab's own operators:
    # CI time)
    Fixture("extension-plant", "junk planted over the libraries in the extensions folder", E,
            chain(stub(E, "cpp-op"), stub(E, "cpp-autograd"), stub(E, "boxed-fallback"),
                  learner_cell("check", _PLANT_EXTENSIONS, "extensions.compile-ready")),
            {slug: ("error", f"extensions.{slug} is still the stub")
             for slug in ("cpp-op", "cpp-autograd", "boxed-fallback")}),
    Fixture("loader-hang-and-borrowed-mechanisms", "a loader whose iterator never ends, with a "
            "worker left running; hook_order bound to the course's own helper that runs real "
            "hooks; a Module that puts nn.Module under the probe's class statement", M,
            chain(after(M, "loader", _HANGING_LOADER), after(M, "hook-order", _BORROWED_HOOKS),
                  after(M, "mini-module", _MODULE_BY_MRO_ENTRIES)),
            {"loader": ("failed", "was still running after 10 s"),
             "hook-order": ("failed", "labs/modules/probes.py: traced_run, the course's own code"),
             "mini-module": ("failed", "your answer is torch/nn/modules/module.py: Module")}),
    # (input-bound and checkpoint left as stubs: CI time)
    Fixture("case-runs-that-escape-kill-or-exit", "a fixed script that leaves a daemon in a "
            "session of its own, one that kills the kernel it was forked from, one that exits "
            "before returning, a reply that is a list", P,
            chain(after(P, "nan", _ESCAPING_RUN), after(P, "leak", _KILLS_THE_KERNEL),
                  after(P, "hang", _EXITS_AT_ONCE), after(P, "recompiles", _A_LIST),
                  stub(P, "input-bound"), stub(P, "checkpoint")),
            {"leak": ("crashed", "the kernel died while running the checks"),
             "hang": ("failed", "exited with status 0 and no result"),
             "recompiles": ("failed", "your answer returned a list"),
             "input-bound": ("error", "production.input-bound is still the stub"),
             "checkpoint": ("error", "production.checkpoint is still the stub")}),
    Fixture("rank-faults", "a rank that hangs, a rank that exits early, a process group leaked "
            "into the kernel (destroyed before the next ranks start: it costs nothing)", N,
            chain(after(N, "ring-allreduce", _HANGING_RANK), after(N, "mini-ddp", _EXITING_RANK),
                  before(N, "dtensor-redistribute", _LEAKED_GROUP)),
            {"ring-allreduce": ("error", "did not finish within"),
             "mini-ddp": ("error", "rank 1 exited (exit code 0) before returning a result")}),
    Fixture("answer-duplicated-and-patched-observers", "an answer cell duplicated (a wrong "
            "first try above); what the grader observes in the kernel (strays, torch's state) "
            "patched to see nothing, then torch patched", A,
            chain(_duplicate_answer, after(A, "per-sample-grads", _PATCH_OBSERVERS)),
            {"per-sample-grads": ("failed", _PER_SAMPLE_MISS)},
            notes=("autograd.engine has 2 answer cells; they ran in order, so the last, the "
                   "code cell starting \"import heapq\", defines",)),
    Fixture("answer-markdown-and-fake-grade", "an answer cell turned into markdown; the "
            "grader's grade() replaced by one that always passes", A,
            chain(_markdown_answer,
                  stub(A, "per-sample-grads"), after(A, "per-sample-grads", _FAKE_GRADE)),
            {"engine": ("error", "is a markdown cell, so it did not run"),
             "per-sample-grads": ("error", "autograd.per-sample-grads is still the stub")}),
    Fixture("edited-release-and-relabelled-answers", "setup edited, narrative and check cells "
            "deleted and moved; answer cells relabelled to another or an unknown exercise", A,
            chain(_relabel_answer, _edit_release_cells),
            notes=("differs from the release", "missing and were put back", "were moved",
                   "autograd.graph-walk has 2 answer cells",
                   "'autograd.bogus', which lab autograd", "no answer cell for autograd.engine")),
    # broken notebooks
    Fixture("invalid-json", "invalid JSON", A, raw(b'{"cells": [{"cell_type": "code",'),
            {s: ("error", "not a readable Jupyter notebook") for s in ("graph-walk", "engine")},
            error="not a readable Jupyter notebook"),
    Fixture("empty-file", "an empty file", A, raw(b""),
            {"engine": ("error", "not a readable Jupyter notebook (the file is empty)")},
            error="not a readable Jupyter notebook"),
    Fixture("not-a-notebook", "a file that is not a notebook", A,
            raw(b"\x89PNG\r\n\x1a\n" + bytes(range(256))),
            {"engine": ("error", "not a readable Jupyter notebook")},
            error="not a readable Jupyter notebook"),
    Fixture("symlink-elsewhere", "a symbolic link to a private file of the instructor's", A,
            _symlink, {"engine": ("error", "not a readable Jupyter notebook (it is not JSON")},
            error="it is not JSON"),
    # (what real learners do, in an nbformat 3 file: the learner's cells are kept without ids)
    Fixture("nbformat-3-and-global-state", "nbformat 3 (no cell ids: release cells matched by "
            "content); torch.set_default_dtype(float64) after setup, and grad mode switched off "
            "after the first check", A,
            chain(learner_cell("setup", "torch.set_default_dtype(torch.float64)"),
                  learner_cell("check", "torch.set_grad_enabled(False)", "autograd.graph-walk"),
                  _nbformat(3)), clean=True),
    Fixture("nbformat-5", "a newer nbformat than supported", A, _nbformat(5),
            {"engine": ("error", "saved as nbformat 5, newer than the grader reads")},
            error="saved as nbformat 5"),
    # (the kernelspec and the file name are read apart: each gets its own note)
    Fixture("other-lab-unknown-kernelspec", "a notebook of another lab under this lab's name, "
            "asking for a kernelspec that does not exist here", D, _kernelspec,
            path="other-lab-unknown-kernelspec/02_autograd.ipynb", result_lab=D,
            notes=("the file name says lab autograd, but the notebook is lab dispatcher",
                   "asks for the kernel 'julia-1.9'; it was graded with the course's kernel")),
    Fixture("no-lab", "a notebook of no lab", A, _no_lab, path="no-lab/homework.ipynb",
            error="cannot tell which lab", result_lab="unknown"),
    Fixture("huge-at-unicode-path", "a notebook with 32 MB of embedded outputs, at a path with "
            "spaces and non-ASCII characters, saved with a byte-order mark and CR LF line endings "
            "(VS Code on Windows)", A, chain(_huge, _crlf, _bom),
            path="Zoë Müller/02_autograd.ipynb", clean=True),
    # what real learners' notebooks do (not hostile): each must cost nothing, or only its own
    # exercise with a message that says what to change
    Fixture("default-tensor-type-crlf-without-ids", "torch.set_default_tensor_type("
            "DoubleTensor) after setup, in a file with CR LF line endings, nbformat 4.4 without "
            "cell ids", D,
            chain(learner_cell("setup", "torch.set_default_tensor_type(torch.DoubleTensor)"),
                  _crlf, _without_ids), clean=True),
    Fixture("trailing-comma", "a notebook whose JSON is broken by a trailing comma", A,
            raw(b'{"cells": [],\n "metadata": {},\n}'),
            {"engine": ("error", "it is not JSON: Expecting property name enclosed in double "
                        "quotes at line 3, column 1; fix it there in a text editor")},
            error="at line 3, column 1", path="flat/alice_02_autograd.ipynb"),
    Fixture("copy-without-metadata", "a browser's copy of the notebook from an editor that "
            "drops cell and notebook metadata (ids kept)", A, _drop_cell_metadata,
            path="flat/Copy of 02_autograd (2).ipynb",
            notes=(f"{len(load_lab(A).exercises)} answer cell(s) had lost their metadata",)),
    Fixture("learner-io", "input(), a file beside the notebook, a lone surrogate printed", D,
            chain(*(before(D, slug, code) for slug, code in _LEARNER_IO.items()),
                  before(D, "key-priority", "print('caf\\udce9 \\ud800 done')")),
            {"views": ("error", "Your answer cell raised StdinNotImplementedError: raw_input was "
                       "called, but this frontend does not support input requests (input() "
                       "waits for a keyboard, and the grader has none: remove the call"),
             "op-trace": ("error", "No such file or directory: 'data.csv' (grading runs in an "
                          "empty folder, so files beside your notebook are not there")}),
]


def write(fixture: Fixture, folder: Path) -> Path:
    """Write ``fixture``'s submission under ``folder``; return its path."""
    built = fixture.build(perfect(fixture.lab))
    path = folder / fixture.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(built, Path):
        path.symlink_to(built)
    elif isinstance(built, bytes):
        path.write_bytes(built)
    else:
        path.write_text(nbformat.writes(built, version=4), encoding="utf-8")
    return path


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "build/hostile")
    for fx in FIXTURES:
        print(write(fx, out))
