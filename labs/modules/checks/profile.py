"""Checks of ``modules.profile``: ``hot_op(trace)`` reads the text of a Chrome trace exported by
``torch.profiler`` (CPU activity, ``record_shapes=True``; some profile every thread) and returns,
for the (operator name, input shapes) group with the largest total self CPU time, ``{"name",
"input_shapes", "calls", "self_us", "share"}``, as ``prof.key_averages(group_by_input_shape=True)``
counts them: its events are the trace's ``cpu_op`` and ``user_annotation`` events; an event's self
time is its duration less its direct children's on its own thread (nesting by time), after an
event that is its parent's only child and has its name is merged into it
(``torch/autograd/profiler_util.py: EventList._populate_cpu_children, _remove_dup_nodes``); share
is that self time over the self time of every event.

The judge profiles small programs here, in the grader's process (the first profile of a process
costs about 2 seconds, paid once: traces are kept per program and seed), exports each trace to a
temporary file, sends its text, and compares the reply with ``key_averages`` of the same profile
(``torch/autograd/profiler_util.py: EventList.key_averages, FunctionEventAvg``): the group must be
key_averages' hottest or within 1 % of it, with its call count, its self time (to rounding) and
its share (within 0.01).
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.modules import probes

EXERCISE = "modules.profile"
FIELDS = ("name", "input_shapes", "calls", "self_us", "share")
SELF_RULE = ("an event's self time is its duration less the durations of its direct children "
             "(the events nested in it, by time, on the same thread)")


def _python_work(n: int) -> int:
    """Work for the interpreter alone: inside a record_function range, self time of the
    range."""
    return sum(i * i for i in range(n))


def matmul_program(g: torch.Generator):
    """Three steps, each some Python, six small tanh(matmul)s and one big matmul."""
    big, small = torch.randn(512, 512, generator=g), torch.randn(24, 24, generator=g) * 0.2

    def run():
        s = small
        for _ in range(3):
            with torch.profiler.record_function("step"):
                _python_work(3000)
                for _ in range(6):
                    s = torch.tanh(s @ small)
                big @ big

    return run


def conv_program(g: torch.Generator):
    """Two steps of a 3x3 convolution, a relu and an add."""
    x, w = torch.randn(4, 16, 32, 32, generator=g), torch.randn(32, 16, 3, 3, generator=g)

    def run():
        for _ in range(2):
            with torch.profiler.record_function("step"):
                _python_work(1000)
                y = torch.nn.functional.conv2d(x, w, padding=1)
                torch.relu(y) + 1

    return run


def float64_program(g: torch.Generator):
    """Two steps of a matmul done in float64 by accident (.double()), then back to float32."""
    x, w = torch.randn(320, 320, generator=g), torch.randn(320, 320, generator=g)

    def run():
        for _ in range(2):
            with torch.profiler.record_function("step"):
                _python_work(1000)
                y = (x.double() @ w.double()).float()
                y + 1

    return run


def copy_program(g: torch.Generator):
    """Two steps, each making a transposed matrix contiguous eight times (a copy in a loop)."""
    x = torch.randn(384, 384, generator=g)

    def run():
        for _ in range(2):
            with torch.profiler.record_function("step"):
                _python_work(1000)
                for _ in range(8):
                    y = x.t().contiguous()
                y.mul(2)

    return run


def reduction_program(g: torch.Generator):
    """Two steps of a full sum over a big matrix (aten::sum calls aten::sum.dim_IntList, one
    event nested in another of its name) and small ops."""
    x, small = torch.randn(1500, 1500, generator=g), torch.randn(16, 16, generator=g)

    def run():
        for _ in range(2):
            with torch.profiler.record_function("step"):
                _python_work(1000)
                x.sum()
                for _ in range(4):
                    small.relu() * 2

    return run


def waiting_program(g: torch.Generator):
    """The main thread waits, in a "wait" range, for a worker thread that runs three big
    matmuls and many small adds (profiled with every thread): the range's self time is the
    wait."""
    x, small = torch.randn(320, 320, generator=g), torch.randn(16, 16, generator=g)

    def worker():
        for _ in range(3):
            x @ x
        for _ in range(150):
            small + 1

    def run():
        with torch.profiler.record_function("wait"):
            t = threading.Thread(target=worker)
            t.start()
            t.join()

    return run


#: name -> (program, whether its profile covers every thread)
PROGRAMS = {"matmul": (matmul_program, False), "conv": (conv_program, False),
            "float64": (float64_program, False), "copy": (copy_program, False),
            "reduction": (reduction_program, False), "waiting": (waiting_program, True)}


@functools.lru_cache(maxsize=16)
def profiled(name: str, seed: int) -> tuple[str, tuple, float]:
    """Profile program ``name`` (inputs from ``seed``) and return ``(the trace's text, the rows
    of key_averages(group_by_input_shape=True) as (name, input shapes, is a user annotation,
    count, self us), the total self time)``."""
    from torch.profiler import ProfilerActivity, profile

    program, every_thread = PROGRAMS[name]
    run = program(torch.Generator().manual_seed(seed))
    extra = {}
    if every_thread:
        extra["experimental_config"] = torch._C._profiler._ExperimentalConfig(
            profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **extra) as prof:
        run()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    rows = tuple((e.key, e.input_shapes, e.is_user_annotation, e.count, e.self_cpu_time_total)
                 for e in prof.key_averages(group_by_input_shape=True))
    return text, rows, sum(r[4] for r in rows)


def _shapes(shapes) -> str:
    return str(shapes).replace(" ", "")


def judge(got, rows: tuple, total: float, label: str) -> None:
    """Compare one reply of hot_op with key_averages' ``rows`` of the same profile."""
    if type(got) is not dict:
        raise CheckFailure(f"on {label}, hot_op returned a {type(got).__name__}; return a dict "
                           f"with the keys {', '.join(FIELDS)}.")
    missing = [k for k in FIELDS if k not in got]
    if missing:
        raise CheckFailure(f"on {label}, hot_op's dict has no {', '.join(missing)}; return "
                           f"the keys {', '.join(FIELDS)}.")
    name, shapes = got["name"], got["input_shapes"]
    if type(name) is not str or type(shapes) is not list:
        raise CheckFailure(f"on {label}, hot_op's name must be a str and its input_shapes a "
                           "list (the event's args['Input Dims'], [] when it has none).")
    for key in ("calls", "self_us", "share"):
        if type(got[key]) not in (int, float):
            raise CheckFailure(f"on {label}, hot_op's {key} is a {type(got[key]).__name__}; "
                               "return a number.")
    top = max(rows, key=lambda r: r[4])
    mine = next((r for r in rows if r[0] == name and r[1] == shapes), None)
    where = (f"key_averages(group_by_input_shape=True) puts {top[0]} with input shapes "
             f"{_shapes(top[1])} first: {top[4]:.1f} us of self time over {top[3]} call(s)")
    if mine is None:
        others = [_shapes(r[1]) for r in rows if r[0] == name][:3]
        has = (f"; it has {name} with input shapes {', '.join(others)}" if others else "")
        raise CheckFailure(
            f"on {label}, hot_op names {name} with input shapes {_shapes(shapes)}, a group "
            f"key_averages does not have{has}; {where}. Group events by (name, "
            "args['Input Dims']); an event that is its parent's only child and has the "
            "parent's name is merged into the parent, not a group of its own.")
    if mine[4] < 0.99 * top[4]:
        raise CheckFailure(
            f"on {label}, hot_op names {name} with input shapes {_shapes(shapes)}, whose self "
            f"time key_averages counts as {mine[4]:.1f} us; {where}. Rank groups by their "
            f"total self time: {SELF_RULE}.")
    if got["calls"] != mine[3]:
        raise CheckFailure(
            f"on {label}, hot_op counts {got['calls']} call(s) of {name} with input shapes "
            f"{_shapes(shapes)}; key_averages counts {mine[3]}. A group is one (name, input "
            "shapes) pair; an event merged into its parent (its only child, of the same name) "
            "is not a call of its own.")
    if abs(got["self_us"] - mine[4]) > 0.5 + 1e-3 * mine[4]:
        raise CheckFailure(
            f"on {label}, hot_op gives {got['self_us']:.1f} us of self time to {name}; "
            f"key_averages counts {mine[4]:.1f} us. {SELF_RULE[0].upper() + SELF_RULE[1:]}; "
            "an event that is its parent's only child and has the parent's name is merged "
            "into it first (its children become the parent's).")
    share = mine[4] / total
    if abs(got["share"] - share) > 0.01:
        raise CheckFailure(
            f"on {label}, hot_op's share is {got['share']:.3f}; key_averages' is {share:.3f}: "
            f"{mine[4]:.1f} us over the {total:.1f} us of self time of all its events (every "
            "cpu_op and user_annotation event, on every thread).")


def verify(hot_op, cases: list[tuple[str, int]]) -> None:
    """Profile each ``(program, seed)``, send the traces in one probe, judge each reply."""
    profiles = [profiled(name, seed) for name, seed in cases]
    reply = hot_op.probe(probes.hottest, [text for text, _, _ in profiles])
    for ((name, _), (_, rows, total)), got in paired(list(zip(cases, profiles)), reply,
                                                      "traces"):
        if isinstance(got, dict) and set(got) == {"raised"}:
            raise AnswerRaised(got["raised"])
        judge(got, rows, total, f"the trace of the {name} program")


@check(EXERCISE)
def matmul_and_reduction_traces(hot_op, ctx):
    """A big matmul among small ones, and a sum that calls a sum (merged into one event)"""
    verify(hot_op, [("matmul", ctx.seed), ("reduction", ctx.seed)])


@check(EXERCISE, hidden=True)
def seeded_traces(hot_op, ctx):
    """A thread waiting for a worker, and a seeded conv, float64 or copy program"""
    g = ctx.generator(1)
    third = ("conv", "float64", "copy")[int(torch.randint(0, 3, (), generator=g))]
    verify(hot_op, [("waiting", ctx.seed), (third, ctx.seed)])
