"""Checks of ``allocator.autocast``: the learner's ``MiniAutocast``, a context manager (a
``TorchFunctionMode``) that must run the lab's programs as ``torch.autocast("cpu",
dtype=torch.bfloat16)`` does: the same outputs bit for bit (dtypes included), the same number of
casts after each call (``aten._to_copy``, so the same cast cache: a float32 leaf that requires grad
is cast once per outermost region, anything else each time) and the same gradients. Models
``aten/src/ATen/autocast_mode.cpp``: the ``AutocastCPU`` kernels' three policies
(``lower_precision_fp``, ``fp32``, ``promote``), ``cached_cast`` and ``is_eligible``
(``ATen/autocast_mode.h``), and ``torch/amp/autocast_mode.py: autocast.__exit__`` (the cache
cleared when the outermost region ends). The probe :func:`labs.allocator.probes.autocast_runs` runs
each case in the kernel under ``MiniAutocast()``; the judge runs it here under the real
``torch.autocast`` (the oracle) with :func:`labs.allocator.probes.amp_run`. Public: the notebook's
program, in one region, in two, nested; hidden: seeded random programs of linear, matmul, mm, addmm
and pointwise steps with reused weights, and outputs through each policy."""

from __future__ import annotations

import random

import torch

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.allocator import probes

EXERCISE = "allocator.autocast"
#: the notebook's program (section 8)
GIVEN = [["linear", 0, True], ["relu"], ["linear", 1, False], ["matmul", 1], ["mse_loss"],
         ["cat"], ["prod"], ["log_softmax"], ["h"]]
_REGIONS = {"one": "one region", "two": "two regions, one call each",
            "nested": "a region nested in another, then a call in the outer one"}


def _tensors(g: torch.Generator, n: int, d: int, params: int) -> dict:
    return {"x": torch.randn(n, d, generator=g), "W": [torch.randn(d, d, generator=g) / d ** 0.5
                                                       for _ in range(params)],
            "b": [torch.randn(d, generator=g) for _ in range(params)],
            "t": torch.randn(n, d, generator=g),
            "y16": torch.randn(2, d, generator=g).bfloat16(),
            "z64": torch.randn(1, d, generator=g).double()}


def _real():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _outputs(kinds: list[str]) -> list[str]:
    return [k for k in kinds if k in ("mse_loss", "prod", "cdist", "cat", "log_softmax", "h")]


def verify(MiniAutocast, cases: list[tuple]) -> None:
    """``cases``: (spec, tensors, regions, label); one probe for them all, judged in order."""
    reply = MiniAutocast.probe(probes.autocast_runs, [[spec, tensors, regions]
                                                      for spec, tensors, regions, _ in cases])
    for (spec, tensors, regions, label), seen in paired(cases, reply, "cases"):
        if "raised" in seen:
            raise AnswerRaised(seen["raised"])
        if seen.get("real_autocast") is not False:
            raise CheckFailure(
                f"on {label}, ops reached the dispatcher with torch's own AutocastCPU key on "
                "(taken out of the thread's excluded set): that is torch.autocast at work, the "
                "mechanism this exercise asks you to model. Cast the arguments yourself in "
                "__torch_function__.")
        want = probes.amp_run(_real, spec, tensors, regions)
        where = f"on {label} ({_REGIONS[regions]})"
        names = _outputs([step[0] for step in spec])
        for k, (real_call, call) in enumerate(paired(want["outputs"], seen["outputs"], "calls")):
            for name, (real, mine) in zip(names, paired(real_call, call, "outputs")):
                if type(mine) is not torch.Tensor or mine.dtype != real.dtype:
                    what = mine.dtype if type(mine) is torch.Tensor else type(mine).__name__
                    raise CheckFailure(
                        f"{where}, call {k + 1}: the {name} output is {what} under "
                        f"MiniAutocast, {real.dtype} under torch.autocast. {_POLICY[name]}")
                if not torch.equal(mine, real):
                    raise CheckFailure(
                        f"{where}, call {k + 1}: the {name} output has autocast's dtype but other "
                        "values: the ops ran on other inputs. Cast each input exactly as "
                        "autocast does (to bfloat16 for the lower-precision ops, float32 for the "
                        "fp32 ones), and nothing else.")
        casts, real_casts = seen["casts"], want["casts"]
        if casts != real_casts:
            raise CheckFailure(
                f"{where}: your casts, counted after each call: {casts}; torch.autocast's: "
                f"{real_casts}. {_CACHE}")
        for i, (mine, real) in enumerate(paired(want["grads"], seen["grads"], "gradients")):
            if (mine is None) != (real is None) or (real is not None and not torch.equal(
                    mine, real)):
                raise CheckFailure(f"{where}: the gradient of parameter {i} differs from "
                                   "torch.autocast's: cast with differentiable ops (Tensor.to) "
                                   "inside the region, as autocast's key does above autograd.")


_POLICY = {
    "mse_loss": "mse_loss is on the fp32 list: its floating inputs are cast to float32.",
    "prod": "prod is on the fp32 list: its floating inputs are cast to float32.",
    "cdist": "cdist is on the fp32 list: its floating inputs are cast to float32.",
    "cat": "cat is on the promote list: its floating inputs (but float64 ones, which autocast "
           "never touches) are cast to the widest of their dtypes.",
    "log_softmax": "log_softmax is on no list: it runs in its input's dtype.",
    "h": "matmul, mm, addmm and linear are on the lower-precision list: their floating inputs "
         "are cast to bfloat16, so their outputs are bfloat16; pointwise ops keep their input's "
         "dtype.",
}
_CACHE = ("Autocast caches the bfloat16 copy of a float32 leaf that requires grad (a "
          "parameter) and is not a view, and reuses it for every later op of the region; other "
          "tensors are cast at each op. The cache is cleared only when the outermost region "
          "ends (autocast.__exit__, when the nesting count drops to 0).")


@check(EXERCISE)
def given_program(MiniAutocast, ctx):
    """runs section 8's program as torch.autocast does: in one region, in two, nested"""
    g = torch.Generator().manual_seed(0)
    tensors = _tensors(g, 5, 6, 2)
    verify(MiniAutocast, [(GIVEN, tensors, regions, "section 8's program")
                          for regions in ("one", "two", "nested")])


def random_spec(rng: random.Random, params: int) -> list:
    """A seeded program: 2 to 6 steps, the params drawn with replacement (reused weights), then
    2 or 3 outputs and h."""
    steps = []
    for _ in range(rng.randint(2, 6)):
        kind = rng.choice(["linear", "linear", "matmul", "mm", "addmm", "relu", "tanh", "add_y"])
        if kind == "linear":
            steps.append(["linear", rng.randrange(params), rng.random() < 0.5])
        elif kind in ("matmul", "mm", "addmm"):
            steps.append([kind, rng.randrange(params)])
        else:
            steps.append([kind])
    outputs = rng.sample(["mse_loss", "prod", "cdist", "cat", "log_softmax"], rng.randint(2, 3))
    return steps + [[o] for o in outputs] + [["h"]]


@check(EXERCISE, hidden=True)
def random_programs(MiniAutocast, ctx):
    """runs seeded random programs as torch.autocast does"""
    rng = random.Random(ctx.seed + 8000)
    g = torch.Generator().manual_seed(ctx.seed)
    cases = []
    for k in range(6):
        params = rng.randint(1, 3)
        spec = random_spec(rng, params)
        tensors = _tensors(g, rng.randint(2, 6), rng.randint(2, 8), params)
        cases.append((spec, tensors, ("one", "two", "nested")[k % 3],
                      f"random program {k + 1}"))
    verify(MiniAutocast, cases)
