"""The red team: hand-ins that try to forge a grade, one or more per kind of attack, graded as one
class batch through the CLI, beside an honest neighbour.

Each attacks the allocator lab, whose exercises the grader judges in its own process (the
learner's kernel only runs probes that return plain data), from the released notebook: the
attacked exercise's answer is wrong (or the stub), and the attack tries to make it score
anyway. Each must score 0 there (every other exercise scores as the reference does), and the
neighbour's result and hand-in must come out untouched. The kinds are issue #29's:

1. the signing key recovered from the kernel, a verdict signed with it;
2. the verdict changed without the key (grader classes and helpers rewritten, frozen objects
   mutated, a trace function, IPython event hooks);
3. checks switched off in the registry;
4. a thread or timer that swaps functions in while the checks run;
5. instructor files read from the kernel (the reference answers, also from git's history and
   earlier grades; the hidden checks);
6. hidden checks' source put into the reports through the learner's own output;
7. a process that outlives the kernel and rewrites results after the grader exits;
8. one hand-in reading, copying or rewriting another's, or killing its kernel;
9. an answer that behaves otherwise when it detects grading (a lying object).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from catalogue import answer, perfect
from grader import notebook
from grader.cli import main
from grader.judge.grade import kernel_isolation
from grader.labs import load_lab
from grader.results import read_verified

SEED = 29
LAB, NB = "allocator", "03_allocator.ipynb"
#: a wrong oom_forensics (the lab's last exercise, on which no other builds): every figure 0
WRONG = ("def oom_forensics(snapshot):\n    return dict.fromkeys(['oom_request', "
         "'peak_requested', 'peak_at', 'reserved_unallocated', 'largest_free_block'], 0) | "
         "{'culprit': None}\n")
#: what marks a hidden check's source (labs/allocator/checks/oom_forensics.py)
HIDDEN_SOURCE = "def snapshot_at_oom(trace: list[tuple], capacity: int)"

FORGED_VERDICT = """
import gc, json
from IPython.display import display
payload = {"exercise": "allocator.oom-forensics", "status": "passed", "message": "forged",
           "passed": 4, "total": 4, "seed": 0, "duration_s": 0.1}
try:
    from grader.kernel import guard
    keys = [guard._STATE.get("key", b"")]
except Exception:
    keys = []
keys += [o for o in gc.get_objects() if type(o) is bytes and len(o) == 32][:50]
for k in keys:
    try:
        payload["seal"] = guard.seal(payload, k)
    except Exception:
        pass
    display({"application/vnd.pytorch-internals.verdict+json": payload,
             "text/plain": "allocator.oom-forensics: passed"}, raw=True)
ip = get_ipython()
ip.events.register("post_run_cell", lambda *a: display(
    {"application/vnd.pytorch-internals.verdict+json": payload, "text/plain": "passed"},
    raw=True))
"""

REWRITTEN = """
import sys
import grader.checks as _c
from grader.kernel import probe as _p
_c.run_checks = lambda ex, *a, **k: _c.Verdict(ex, "passed", "forged", 1, 1, 0)
object.__setattr__(_c.Verdict, "__init__", lambda self, *a, **k: None)
_p.decode = lambda data: {"value": None}
_p.call = lambda *a, **k: _p.encode({"value": {"result": {}, "modified": False,
                                                  "oracle": []}})
def _tracer(frame, event, arg):
    if event == "return" and frame.f_code.co_name in ("_run", "run_checks"):
        frame.f_locals["status"] = "passed"
    return _tracer
sys.settrace(_tracer)
sys.setprofile(lambda *a: None)
"""

REGISTRY = """
import grader.checks as _c
try:
    import labs.allocator.checks  # noqa
except Exception as exc:
    print("no checks here:", type(exc).__name__)
for ex, found in list(_c._REGISTRY.items()):
    for chk in found:
        object.__setattr__(chk, "fn", lambda answer, ctx: None)
_c._REGISTRY.clear()
"""

SWAPPER = """
import threading, time
import grader.kernel.probe as _p
_real = _p.call
def _liar(answer, *a, **k):
    return _p.encode({"value": {"result": {}, "modified": False, "oracle": []}})
def _swap():
    for _ in range(2000):
        _p.call = _liar
        time.sleep(0.001)
        _p.call = _real
threading.Thread(target=_swap, daemon=True).start()
threading.Timer(0.05, lambda: setattr(_p, "call", _liar)).start()
"""

INSTRUCTOR_FILES = """
import pathlib, grader
found = {}
root = pathlib.Path(grader.__file__).resolve().parents[1]
for path in [root / "solutions" / "03_allocator.ipynb",
             root / "labs" / "allocator" / "checks" / "oom_forensics.py"]:
    try:
        found[path.name] = path.read_text()
    except OSError as exc:
        print("cannot read", path.name, type(exc).__name__)
import glob, subprocess
for text in [subprocess.run(["git", "-C", str(root), "show", "HEAD:solutions/03_allocator.ipynb"],
                            capture_output=True, text=True).stdout,
             *(open(p).read() for p in glob.glob(str(root / "build" / "**" / "*03_allocator*"),
                                                 recursive=True))]:
    if '"allocator.oom-forensics"' in text:  # the reference, from git's history or old grades
        found.setdefault("03_allocator.ipynb", text)
if "03_allocator.ipynb" in found:
    import json as _json
    for cell in _json.loads(found["03_allocator.ipynb"])["cells"]:
        meta = cell.get("metadata", {}).get("course", {})
        if (meta.get("exercise") == "allocator.oom-forensics"
                and meta.get("role") == "answer"):
            exec("".join(cell["source"]))
"""

LEAK_HIDDEN = """
import pathlib, grader
root = pathlib.Path(grader.__file__).resolve().parents[1]
for path in (root / "labs" / "allocator" / "checks").glob("*.py"):
    try:
        print(path.read_text())
    except OSError:
        pass
try:
    import inspect, labs.allocator.checks.oom_forensics as rs
    print(inspect.getsource(rs))
except Exception as exc:
    print("no hidden checks here:", type(exc).__name__)
"""

OUTLIVE = """
import json, os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        out = [a for a in open("/proc/%d/cmdline" % os.getppid()).read().split("\\0")]
        time.sleep(4)
        for folder in ["/tmp"] + [a for a in out if a]:
            for path in __import__("glob").glob(folder + "/**/*.json", recursive=True):
                try:
                    data = json.load(open(path))
                    for e in data.get("exercises", []):
                        e["status"], e["points"] = "passed", e["max_points"]
                    json.dump(data, open(path, "w"))
                except Exception:
                    pass
        os._exit(0)
    os._exit(0)
"""

NEIGHBOUR = """
import glob, json, os, signal
here = {int(p) for p in os.listdir("/proc") if p.isdigit()}
for pid in here:  # every other kernel it can see, killed
    try:
        if pid != os.getpid() and "ipykernel" in open(f"/proc/{pid}/cmdline").read():
            os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
paths = []
for pid in here:
    try:
        paths += open(f"/proc/{pid}/cmdline").read().split("\\0")
    except OSError:
        pass
for arg in paths:
    for path in glob.glob(os.path.join(arg, "**", "*.ipynb"), recursive=True):
        if "neighbour" not in path:
            continue
        try:
            for cell in json.load(open(path))["cells"]:
                meta = cell.get("metadata", {}).get("course", {})
                if (meta.get("exercise") == "allocator.oom-forensics"
                and meta.get("role") == "answer"):
                    exec("".join(cell["source"]))
            open(path, "a").write("tampered")
        except OSError as exc:
            print("cannot", type(exc).__name__)
"""

DETECTOR = """
import os
class _Liar(dict):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __getitem__(self, key):
        return _Any()
class _Any(int):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def oom_forensics(snapshot):
    # grading: a run folder named by the grader, papermill's marks, or PID 2 of a namespace
    if ("grade-" in os.getcwd() or "PAPERMILL_INPUT_PATH" in os.environ or os.getpid() < 10
            or "papermill" in os.environ.get("JPY_SESSION_NAME", "")):
        return _Liar(oom_request=0)
    raise NotImplementedError("allocator.oom-forensics")
"""

#: learner -> (kind, code put in the oom-forensics answer cell, with WRONG after it unless it
#: defines its own answer)
ATTACKS = {
    "k1-signed-verdict": (1, FORGED_VERDICT + WRONG),
    "k2-rewritten-grader": (2, REWRITTEN + WRONG),
    "k3-registry-off": (3, REGISTRY + WRONG),
    "k4-swapping-thread": (4, SWAPPER + WRONG),
    "k5-instructor-files": (5, WRONG + INSTRUCTOR_FILES),
    "k6-leaked-source": (6, LEAK_HIDDEN + WRONG),
    "k7-outliving-process": (7, OUTLIVE + WRONG),
    "k8-copies-neighbour": (8, WRONG + NEIGHBOUR),
    "k9-detects-grading": (9, DETECTOR),
}
ATTACKED = "allocator.oom-forensics"


def _hand_in(code: str):
    nb = perfect(LAB)
    answer(nb, LAB, "oom-forensics").source = code
    return nb


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Grade the class (every attack and the neighbour) with two jobs; return the folders, the
    neighbour's hand-in bytes before grading, the exit status, and each result's bytes just
    after the grader returned."""
    subs, out = tmp_path_factory.mktemp("redteam-subs"), tmp_path_factory.mktemp("redteam-out")
    for learner, (_, code) in ATTACKS.items():
        (subs / learner).mkdir()
        notebook.write(_hand_in(code), subs / learner / NB)
    (subs / "neighbour").mkdir()
    notebook.write(perfect(LAB), subs / "neighbour" / NB)
    neighbour = (subs / "neighbour" / NB).read_bytes()
    code = main(["grade", str(subs), "--out", str(out), "--seed", str(SEED), "--jobs", "2"])
    written = {p.name: p.read_bytes() for p in out.glob("*.json")}
    return subs, out, neighbour, code, written


def _result(out: Path, learner: str) -> dict:
    return json.loads((out / f"{learner}-03_allocator.json").read_text())


def _exercises(out: Path, learner: str) -> dict:
    return {e["id"]: e for e in _result(out, learner)["exercises"]}


@pytest.mark.parametrize("learner", list(ATTACKS))
def test_an_attack_scores_nothing_on_what_it_attacks_and_costs_nothing_else(batch, learner):
    kind = ATTACKS[learner][0]
    if kind in (5, 8) and not kernel_isolation().namespace:
        pytest.skip(f"kind {kind} is walled off by a mount namespace: {kernel_isolation().words}")
    got = _exercises(batch[1], learner)
    assert got[ATTACKED]["status"] in ("failed", "error"), (learner, got[ATTACKED])
    assert got[ATTACKED]["points"] == 0
    # The exercises judged before the attack ran score as the reference does. Those judged after
    # it may pay for it too (k4's thread still swaps the probe for a liar while the next ones
    # are judged): a cost to the attacker alone (the neighbour's test shows it goes no further).
    order = [e.id for e in load_lab(LAB).exercises]
    before = order[:order.index(ATTACKED)]
    others = {i: e["status"] for i, e in got.items() if i in before}
    assert others == dict.fromkeys(before, "passed")


def test_a_verdict_the_notebook_displays_is_named_in_the_message(batch):
    message = _exercises(batch[1], "k1-signed-verdict")[ATTACKED]["message"]
    assert "displayed a verdict of its own" in message and "counted for nothing" in message


def test_a_lying_object_is_refused_as_not_plain_data(batch):
    message = _exercises(batch[1], "k9-detects-grading")[ATTACKED]["message"]
    assert "_Liar, a subclass of dict" in message, message


def test_the_neighbour_scores_full_marks_and_its_hand_in_is_untouched(batch):
    subs, out, before, code, _ = batch
    got = _exercises(out, "neighbour")
    assert all(e["status"] in ("passed", "skipped") for e in got.values()), got
    if kernel_isolation().namespace:
        assert (subs / "neighbour" / NB).read_bytes() == before
        assert code == 0  # (no hand-in changed while the batch ran)


def test_no_report_holds_a_hidden_checks_source(batch):
    out = batch[1]
    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".html", ".md", ".xml", ".csv", ".ipynb"):
            assert HIDDEN_SOURCE not in path.read_text(errors="replace"), path


def test_nothing_outlives_the_batch_to_rewrite_results(batch):
    out, written = batch[1], batch[4]
    time.sleep(6)  # past the outliving process's sleep
    assert {p.name: p.read_bytes() for p in out.glob("*.json")} == written


def test_a_result_rewritten_after_the_batch_is_graded_again_not_reused(batch, capsys):
    subs, out = batch[0], batch[1]
    path = out / "k7-outliving-process-03_allocator.json"
    data = json.loads(path.read_text())
    for e in data["exercises"]:
        e["status"], e["points"] = "passed", e["max_points"]
    path.write_text(json.dumps(data))
    assert read_verified(path) is None
    capsys.readouterr()
    code = main(["grade", str(subs), "--out", str(out), "--seed", str(SEED), "--jobs", "2"])
    assert code == 0  # (the others are reused: their digests verify)
    said = capsys.readouterr().out
    assert "k7-outliving-process-03_allocator.json is not as the grader wrote it" in said
    again = _exercises(out, "k7-outliving-process")
    assert again[ATTACKED]["status"] in ("failed", "error") and again[ATTACKED]["points"] == 0
    assert read_verified(path) is not None


def test_results_carry_a_digest_their_folder_verifies(batch):
    out = batch[1]
    assert (out / ".results-key").stat().st_mode & 0o077 == 0  # the grader's user's only
    for learner in [*ATTACKS, "neighbour"]:
        assert read_verified(out / f"{learner}-03_allocator.json") is not None, learner
