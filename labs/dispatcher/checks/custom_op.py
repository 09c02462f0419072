"""Checks of ``dispatcher.custom-op``: the learner's ``register_op(qualname)``, which registers
``smooth_max(x, temperature) = temperature * logsumexp(x / temperature, dim=-1)`` as a custom
operator named ``qualname``, with a fake kernel and an autograd formula, and returns it.

Oracles: the torch-composed reference ``t * torch.logsumexp(x / t, -1)`` and its autograd for
values and gradients, computed here, in the grader's process; ``torch.library.opcheck`` for the
registration; ``gradcheck``; the real kernel's outputs for what the fake kernel must report;
``torch.compile`` with a counting backend for graph capture. The operator lives where the answer
registered it, in the learner's kernel: each check sends its inputs (seeded tensors) to
``probes.custom_op``, which registers the operator under a fresh name, runs the check's tasks on
it (calls, vector-Jacobian products, opcheck, gradcheck, torch.compile, FakeTensorMode), removes
it, and returns what they gave as plain data (outputs, opcheck's and gradcheck's messages,
metadata of fake outputs, graph counts).
"""
from __future__ import annotations

from grader.checks import AnswerRaised, CheckFailure, check, paired
from labs.dispatcher import probes
from labs.dispatcher.checks._numbers import mismatch
from labs.dispatcher.checks._plain import refuse, tensor

EXERCISE = "dispatcher.custom-op"


def _first_line(text: str) -> str:
    """The first line of what an exception said (opcheck's and dynamo's are long), with the next
    one when the first only announces it ("backend='...' raised:")."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return text
    text = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return text[:300]


def _reference(x, temperature):
    """What the operator must compute, composed from torch ops (the oracle)."""
    import torch

    return temperature * torch.logsumexp(x / temperature, dim=-1)


def _temperature(g) -> float:
    """A seeded temperature in [0.2, 3], rounded so that messages can quote it."""
    import torch

    return round(float(torch.empty(()).uniform_(0.2, 3.0, generator=g)), 3)


class _Tasks:
    """A check's work for ``probes.custom_op``: tasks sent to the kernel in one probe, each with
    the judge that reads its result here, in order."""

    def __init__(self):
        self.tasks, self.judges = [], []
        self.name = ""  # the operator's name (the probe chooses it), once run

    def add(self, task: list, judge) -> None:
        self.tasks.append(task)
        self.judges.append(judge)

    def run(self, register_op) -> None:
        """Send the tasks; check the registration, then judge each result in order (an answer
        that raised is reported where it raised)."""
        seen = register_op.probe(probes.custom_op, self.tasks)
        if "raised" in seen:
            raise AnswerRaised(seen["raised"])
        self.name = seen["name"]
        _registration(seen)
        for judge, result in paired(self.judges, seen["results"], "calls"):
            if "raised" in result:
                raise AnswerRaised(result["raised"])
            judge(result)


def _registration(seen: dict) -> None:
    """What the probe found under the qualname it gave register_op, against the contract."""
    facts, qualname, name = seen["facts"], seen["qualname"], seen["name"]
    if not facts["found"]:
        raise CheckFailure(
            f"register_op({qualname!r}) registered no operator named {qualname}. Pass the "
            "qualname you are given to torch.library.custom_op(qualname, mutates_args=()), so "
            f"that the operator is reachable as torch.ops.{probes.CUSTOM_OP_NAMESPACE}.{name}.")
    if not facts["callable"]:
        raise CheckFailure(f"register_op returned {facts['returned']}; return the operator "
                           "that torch.library.custom_op gives you (a CustomOpDef, callable as "
                           "op(x, t)).")
    schema, returns = facts["schema"], facts["returns"]
    if facts["args"][:2] != ["Tensor", "float"] or returns != ["Tensor"]:
        raise CheckFailure(
            f"the operator's schema is {schema}; it must take (Tensor x, float temperature) and "
            "return one Tensor. custom_op infers the schema from the type hints: annotate "
            "x: torch.Tensor, temperature: float and the return as torch.Tensor.")
    if facts["mutable"]:
        raise CheckFailure(f"the schema {schema} says the operator mutates an input; smooth_max "
                           "mutates nothing: pass mutates_args=().")


def _compare_values(tasks: _Tasks, x, temperature, where):
    """The operator's output against the reference: shape, dtype and values."""
    import torch

    def judge(seen):
        want = _reference(x, temperature)
        if seen["modified"]:
            raise CheckFailure(f"{where}: the operator modified its input x. It must compute a "
                               "new tensor and leave x alone (mutates_args=() promises exactly "
                               "that).")
        if type(seen["out"]) is dict and not seen["out"]["tensor"]:
            raise CheckFailure(f"{where}: the operator returned {seen['out']['type']}, not a "
                               "tensor.")
        # a subclass could fake allclose/shape/dtype
        got = tensor(seen["out"], f"{where}: the operator's output")
        if got.shape != want.shape or got.dtype != want.dtype:
            raise CheckFailure(
                f"{where}: for x of shape {tuple(x.shape)} and dtype {x.dtype} the operator "
                f"returned shape {tuple(got.shape)}, dtype {got.dtype}; expected shape "
                f"{tuple(want.shape)} (x.shape[:-1]: the last dimension is reduced) and dtype "
                f"{want.dtype}.")
        tol = dict(rtol=1e-5, atol=1e-5) if x.dtype == torch.float32 else dict(rtol=1e-9,
                                                                               atol=1e-9)
        if not torch.isfinite(got).all() and torch.isfinite(want).all():
            raise CheckFailure(
                f"{where}: the operator returned inf or nan for temperature {temperature} where "
                "temperature * logsumexp(x / temperature) is finite: exp(x / temperature) "
                "overflows. Use torch.logsumexp, or subtract the row maximum before "
                "exponentiating.")
        if not torch.allclose(got, want, **tol):
            i, mine, ref, note = mismatch(got, want)
            raise CheckFailure(
                f"{where}: for x of shape {tuple(x.shape)} and temperature {temperature}, output "
                f"element {i} is {mine}; temperature * logsumexp(x / temperature, dim=-1) gives "
                f"{ref}{note}")

    tasks.add(["call", x, temperature], judge)


def _vjp(fn, x, temperature, v):
    """d/dx <fn(x, t), v> computed by autograd here (fn: the reference)."""
    import torch

    t = x.detach().clone().requires_grad_()
    (gx,) = torch.autograd.grad(fn(t, temperature), t, v, allow_unused=True)
    return gx


def _plain_outputs(seen: dict) -> None:
    """Before opcheck / gradcheck compare what the operator returns: its output and the gradient
    of its backward must be plain tensors (a subclass could answer their comparisons as it
    likes). Anything else that goes wrong is left for opcheck / gradcheck to report."""
    if type(seen["out"]) is dict and seen["out"]["tensor"]:
        tensor(seen["out"], "the operator's output")
    if type(seen["grad"]) is dict and seen["grad"]["tensor"]:
        tensor(seen["grad"], "the gradient your backward formula returns for x")


def _check_grads(tasks: _Tasks, x, temperature, where, g):
    """The gradient with respect to x (a vector-Jacobian product with a seeded vector) against
    the reference's autograd."""
    import torch

    v = torch.randn(x.shape[:-1], generator=g, dtype=x.dtype)

    def judge(seen):
        want = _vjp(_reference, x, temperature, v)
        if type(seen["out"]) is dict and not seen["out"]["tensor"]:
            raise CheckFailure(f"the operator returned {seen['out']['type']}, not a tensor.")
        tensor(seen["out"], "the operator's output")
        if not seen["grad_fn"]:
            raise CheckFailure(f"{where}: the operator's output has no grad_fn although x "
                               "requires grad. Register a backward formula with "
                               "op.register_autograd(backward, setup_context=setup_context).")
        if seen["grad"] is None:
            raise CheckFailure(f"{where}: backward gave no gradient for x. The backward function "
                               "must return one value per input of the operator: (gradient for "
                               "x, None for temperature).")
        mine = tensor(seen["grad"], "the gradient your backward formula returns for x")
        if mine.shape != want.shape:
            raise CheckFailure(f"{where}: the gradient for x has shape {tuple(mine.shape)}, not "
                               f"x's shape {tuple(want.shape)}. grad has the output's shape "
                               "x.shape[:-1]: unsqueeze it to broadcast along the reduced "
                               "dimension.")
        tol = dict(rtol=1e-5, atol=1e-6) if x.dtype == torch.float32 else dict(rtol=1e-7,
                                                                               atol=1e-9)
        if not torch.allclose(mine, want, **tol):
            i, got, ref, note = mismatch(mine, want)
            raise CheckFailure(
                f"{where}: for x of shape {tuple(x.shape)} and temperature {temperature}, "
                f"element {i} of the gradient is {got}; torch's autograd of the reference gives "
                f"{ref}{note} d/dx [t * logsumexp(x / t)] = softmax(x / t) along the last "
                "dimension, times grad (unsqueezed).")

    tasks.add(["vjp", x, temperature, v], judge)


_OPCHECK_HINTS = {
    "test_schema": "the kernel does not behave as the schema says: it must not modify x and must "
                   "return a new tensor (not x or a view of x), as mutates_args=() promises",
    "test_autograd_registration": "the autograd formula must be registered with "
                                  "op.register_autograd(backward, setup_context=...)",
    "test_faketensor": "the fake kernel (op.register_fake) must return an empty tensor with the "
                       "real output's shape x.shape[:-1], dtype and device, using only x's "
                       "metadata (x.new_empty(...)), never its values",
    "test_aot_dispatch_dynamic": "AOTAutograd could not trace forward and backward with symbolic "
                                 "shapes: the fake kernel must derive the shape from x.shape, "
                                 "setup_context must save what backward needs, and backward must "
                                 "return (gradient for x, None) computed with torch ops",
}


def _opcheck(tasks: _Tasks, x, temperature, requires_grad: bool, where):
    """torch.library.opcheck on one input (in the kernel); the first failing test is reported
    with a hint."""
    def judge(seen):
        _plain_outputs(seen)
        for test, passed, outcome in seen["opcheck"]:
            if not passed:
                raise CheckFailure(f"torch.library.opcheck failed {test} {where}: "
                                   f"{_first_line(outcome)}. Hint: "
                                   f"{_OPCHECK_HINTS.get(test, '')}.")

    tasks.add(["opcheck", x, temperature, requires_grad], judge)


# --------------------------------------------------------------------------- checks


@check(EXERCISE)
def values(register_op, ctx):
    """registers an operator under the given name computing temperature * logsumexp(x / temperature, -1)"""
    import torch

    g = ctx.generator(40)
    tasks = _Tasks()
    for shape, dtype in (((7,), torch.float32), ((3, 5), torch.float64),
                         ((2, 3, 4), torch.float32)):
        x = torch.randn(shape, generator=g, dtype=dtype) * 2
        _compare_values(tasks, x, _temperature(g), "calling the registered operator")
    x = torch.randn(4, 6, generator=g, dtype=torch.float64)

    def same(seen):
        for what, key in (("what the object register_op returned gives", "mine"),
                          ("what the registered operator gives", "theirs")):
            value = seen[key]
            if type(value) is dict and not value["tensor"]:
                raise CheckFailure(f"calling the operator: {what} is {value['type']}, not a "
                                   "tensor.")
            tensor(value, f"calling the operator: {what}")
        if not torch.equal(seen["mine"], seen["theirs"]):
            raise CheckFailure("the object register_op returned computes something else than "
                               "the registered operator: return what torch.library.custom_op "
                               "gives you.")

    tasks.add(["returned", x, _temperature(g)], same)
    tasks.run(register_op)


@check(EXERCISE)
def passes_opcheck(register_op, ctx):
    """torch.library.opcheck passes: schema, fake kernel, autograd registration, AOT dispatch"""
    import torch

    g = ctx.generator(41)
    tasks = _Tasks()
    x = torch.randn(4, 6, generator=g, dtype=torch.float64) * 2
    _opcheck(tasks, x, _temperature(g), True, "for x of shape (4, 6), float64, requiring grad")
    y = torch.randn(2, 3, 5, generator=g)
    _opcheck(tasks, y, _temperature(g), True, "for x of shape (2, 3, 5), float32, requiring grad")
    tasks.run(register_op)


@check(EXERCISE)
def gradients(register_op, ctx):
    """gradcheck passes in float64 and the gradient matches torch's autograd"""
    import torch

    g = ctx.generator(42)
    tasks = _Tasks()
    t = _temperature(g)
    x = torch.randn(3, 5, generator=g, dtype=torch.float64) * 2

    def judge(seen):
        _plain_outputs(seen)
        if seen["gradcheck"] is not None:
            raise CheckFailure(
                f"gradcheck failed for x of shape (3, 5), temperature {t}: your backward's "
                f"gradient differs from finite differences ({_first_line(seen['gradcheck'])}). "
                "d/dx [t * logsumexp(x / t)] = softmax(x / t, dim=-1), times "
                "grad.unsqueeze(-1).")

    tasks.add(["gradcheck", x, t], judge)
    _check_grads(tasks, torch.randn(2, 4, 3, generator=g, dtype=torch.float64) * 3, t,
                 "gradient check", g)
    tasks.run(register_op)


@check(EXERCISE)
def compiles_to_one_graph(register_op, ctx):
    """torch.compile(fullgraph=True) captures one graph with the operator as one node, forward and backward"""
    import torch

    g = ctx.generator(43)
    t = _temperature(g)
    x = torch.randn(3, 4, 6, generator=g, dtype=torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    tasks = _Tasks()

    def judge(seen):
        if seen["error"] is not None:
            raise CheckFailure(
                "torch.compile(fullgraph=True) failed on (op(x * w, t).sin() + 1).sum(): "
                f"{_first_line(seen['error'])}. Dynamo and AOTAutograd run the operator on "
                "FakeTensors while tracing: register a fake kernel (op.register_fake) that "
                "returns x.new_empty(x.shape[:-1]), and an autograd formula that works with "
                "torch ops.")
        if seen["graphs"] != 1:
            raise CheckFailure(f"torch.compile made {seen['graphs']} graphs of a program that "
                               "needs one.")
        out = tensor(seen["out"], "the compiled program's output")
        for name in ("x", "w"):
            if seen[f"{name}_grad"] is not None:
                tensor(seen[f"{name}_grad"],
                       f"{name}.grad after backward through the compiled program")
        op = f"{probes.CUSTOM_OP_NAMESPACE}.{tasks.name}.default"
        if seen["op_nodes"] != 1:
            raise CheckFailure(
                f"the captured graph has {seen['op_nodes']} call(s) of {op} (expected one): "
                "a custom op must stay one opaque node in the graph.")
        real = _reference(x * w, t)
        traced = seen["traced"]
        if traced is not None and not traced["fake"]:
            refuse(traced["type"], traced["fake_sub"],
                   "while tracing, what your fake kernel returned", "FakeTensor")
        if traced is not None and (tuple(traced["shape"]) != tuple(real.shape)
                                   or traced["dtype"] != real.dtype
                                   or traced["device"] != real.device):
            raise CheckFailure(
                f"while tracing, your fake kernel said the output has shape "
                f"{tuple(traced['shape'])}, dtype {traced['dtype']}, device {traced['device']}; "
                f"the real kernel returns shape {tuple(real.shape)}, dtype {real.dtype}, device "
                f"{real.device}. Return x.new_empty(x.shape[:-1]) from the fake kernel.")
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        want = (_reference(xs * ws, t).sin() + 1).sum()
        want.backward()
        if not torch.allclose(out, want.detach(), rtol=1e-7, atol=1e-9):
            _, got, ref, note = mismatch(out, want)
            raise CheckFailure(f"the compiled program returned {got}; eager torch gives "
                               f"{ref}{note}")
        for name, mine, ref in (("x", seen["x_grad"], xs.grad), ("w", seen["w_grad"], ws.grad)):
            if mine is None or not torch.allclose(mine, ref, rtol=1e-6, atol=1e-8):
                raise CheckFailure(
                    f"after backward through the compiled program, {name}.grad differs from "
                    "eager torch's. AOTAutograd traces your backward formula: check "
                    "setup_context and backward.")

    tasks.add(["compile", x, w, t], judge)
    tasks.run(register_op)


_DEVICE_HINT = ("The fake kernel must put the output on x's device: allocate it with "
                "x.new_empty(x.shape[:-1]), or pass device=x.device (and dtype=x.dtype) to "
                "torch.empty; torch.empty without device= allocates on the default device, cpu.")


def _fake_output(seen: dict, shape, dtype, where: str) -> dict:
    """The fake output's metadata from a ``fake`` or ``fake_on`` task, or a CheckFailure when the
    fake kernel raised or returned other than exactly a FakeTensor."""
    if seen["error"] is not None:
        raise CheckFailure(
            f"running the operator under FakeTensorMode failed for x of shape {shape}, dtype "
            f"{dtype}{where}: {_first_line(seen['error'])}. The fake kernel may use only x's "
            "metadata (shape, dtype, device), never its values (.item(), .tolist(), numpy).")
    out = seen["out"]
    # exactly a FakeTensor: a subclass of it could report any shape, dtype or device
    if not out["fake"]:
        refuse(out["type"], out["fake_sub"], f"under FakeTensorMode, for x of shape {shape}, "
               f"dtype {dtype}{where}, the output of your fake kernel", "FakeTensor")
    return out


@check(EXERCISE, hidden=True)
def fake_kernel_metadata(register_op, ctx):
    """the fake kernel reports the real output's shape, dtype and device on random shapes"""
    import torch

    g = ctx.generator(44)

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    shapes = [(1,), (ri(2, 9),), (0, ri(1, 5)), (ri(1, 4), 1), (ri(1, 4), ri(1, 4), ri(2, 6)),
              (1, 1, 1, ri(2, 5))]
    tasks = _Tasks()
    for shape in shapes:
        real = {}
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            x = torch.randn(shape, generator=g).to(dtype)
            t = _temperature(g)

            def got_real(seen, shape=shape, dtype=dtype, real=real):
                if not seen["plain"]:
                    refuse(seen["type"], seen["tensor"], f"for x of shape {shape} and dtype "
                           f"{dtype}, the operator's output", "Tensor")
                real.update(seen)

            def got_fake(seen, shape=shape, dtype=dtype, real=real):
                fake = _fake_output(seen, shape, dtype, "")
                for what in ("shape", "dtype", "device"):
                    mine, want = fake[what], real[what]
                    if what == "shape":
                        mine, want = tuple(mine), tuple(want)
                    if mine != want:
                        raise CheckFailure(
                            f"for x of shape {shape} and dtype {dtype}, the fake kernel says the "
                            f"output's {what} is {mine}; the real kernel's is {want}.")

            def got_meta(meta, shape=shape, dtype=dtype, real=real):
                if not meta["plain"]:
                    refuse(meta["type"], meta["tensor"], f"on a meta tensor of shape {shape}, "
                           f"dtype {dtype}, the operator's output", "Tensor")
                if tuple(meta["shape"]) != tuple(real["shape"]) or meta["dtype"] != real["dtype"]:
                    raise CheckFailure(
                        f"on a meta tensor of shape {shape} (register_fake also serves the Meta "
                        f"key), the operator returned shape {tuple(meta['shape'])}, dtype "
                        f"{meta['dtype']}; expected {tuple(real['shape'])}, {real['dtype']}.")
                if meta["device"].type != "meta":
                    raise CheckFailure(
                        f"on a meta tensor of shape {shape}, dtype {dtype} (register_fake also "
                        f"serves the Meta key), the operator returned a tensor on "
                        f"{meta['device']}; a meta input must give a meta output. {_DEVICE_HINT}")

            tasks.add(["real", x, t], got_real)
            tasks.add(["fake", x, t], got_fake)
            tasks.add(["meta", x, t], got_meta)
        # A FakeTensor on another device than the real inputs' (cpu; fake tensors need no such
        # device), of the last dtype, with the last temperature.
        other = "cuda"

        def got_other(seen, shape=shape, dtype=dtype, other=other):
            fake = _fake_output(seen, shape, dtype, f" on the fake device {other}")
            if fake["device"] != seen["x_device"]:
                raise CheckFailure(
                    f"under FakeTensorMode, for a fake x on {seen['x_device']} of shape {shape}, "
                    f"dtype {dtype}, the fake kernel says the output is on {fake['device']}; it "
                    f"must be on x's device, {seen['x_device']}. {_DEVICE_HINT}")

        tasks.add(["fake_on", list(shape), dtype, other, t], got_other)
    tasks.run(register_op)


@check(EXERCISE, hidden=True)
def random_inputs(register_op, ctx):
    """values and gradients match torch on random shapes, temperatures (small ones too) and large inputs"""
    import torch

    g = ctx.generator(45)

    def ri(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    tasks = _Tasks()
    cases = [((1,), 1.0), ((ri(2, 9),), 1.0), ((0, ri(1, 5)), 1.0), ((ri(2, 5), 1), 1.0),
             ((ri(1, 4), ri(1, 4), ri(2, 7)), 1.0), ((ri(2, 5), ri(3, 8)), 300.0)]
    for shape, spread in cases:
        for dtype in (torch.float32, torch.float64):
            x = torch.randn(shape, generator=g, dtype=torch.float64).mul(spread).to(dtype)
            t = _temperature(g) if spread == 1.0 else 0.05
            where = f"for x of shape {shape}, {dtype}" + (
                " with entries in the hundreds" if spread > 1 else "")
            _compare_values(tasks, x, t, where)
            if dtype == torch.float64:
                _check_grads(tasks, x, t, where, g)
    # Small temperatures on entries within a few temperatures of each other: there the result
    # is well above x.amax(-1) (by up to t * log(n)), so no shortcut through the maximum.
    for t in (0.05, 0.01, 0.001):
        shape = (ri(1, 4), ri(3, 9))
        x = torch.randn((), generator=g, dtype=torch.float64) * 3 + torch.randn(
            shape, generator=g, dtype=torch.float64) * t
        for dtype in (torch.float32, torch.float64):
            where = (f"{str(dtype)[6:]} x with entries within a few temperatures of each other, "
                     "where the result lies above x.amax(-1) by up to t * log(n)")
            _compare_values(tasks, x.to(dtype), t, where)
            if dtype == torch.float64:
                _check_grads(tasks, x, t, where, g)
    x = torch.randn(5, 4, generator=g, dtype=torch.float64).t()          # not contiguous
    _compare_values(tasks, x, 0.7, "for a transposed (non-contiguous) x")
    _check_grads(tasks, x, 0.7, "for a transposed (non-contiguous) x", g)
    tasks.run(register_op)
