"""autograd.derivatives: plausible wrong generators fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import ast
import re

import pytest
import torch

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingList, lying

EX = "autograd.derivatives"


@pytest.fixture(scope="module")
def reference():
    return load_answer(EX)


@pytest.fixture(scope="module")
def manual(reference):
    return reference.__globals__["FUNCTIONS_MANUAL"]


# ------------------------------------------------------------------ plausible wrong answers
def _generator(manual, *, result_is_self=False, save_all=False, scalar_type_saves_x=False,
               first_input_only=False, tensors_as_attributes=False, lie_about_saved=False):
    """A generator with one deliberate flaw, chosen by the keywords."""

    def generate_backward(entry):
        op_name, params = re.fullmatch(r"([\w.]+)\((.*)\) -> Tensor", entry["name"]).groups()
        base, _, overload = op_name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        params = params.split(", ")
        star = params.index("*") if "*" in params else len(params)
        args = [p.split("=")[0].split()[-1] for p in params if p != "*"]
        kwarg_only = set(args[star:])

        def to_python(formula):
            formula = re.sub(r"/\*\s*(\w+)\s*=\s*\*/", r"\1=", formula)
            formula = formula.replace(".conj()", "").replace("at::", "")
            if scalar_type_saves_x:      # x.scalar_type() evaluated on x itself
                formula = formula.replace(".scalar_type()", ".dtype")
            else:
                formula = re.sub(r"(\w+)\.scalar_type\(\)", r"\1_scalar_type", formula)
            if result_is_self:           # `result` taken for the first argument
                formula = re.sub(r"\bresult\b", "self", formula)
            tree = ast.parse(formula, mode="eval")
            return compile(tree, op_name, "eval"), {
                n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}

        keys = args[:1] if first_input_only else args
        formulas = {a: to_python(entry[a]) for a in keys if a in entry}
        used = set().union(*(names for _, names in formulas.values()))
        saved = [n for n in args + ["result"] if save_all or n in used]

        def forward(ctx, *values):
            bound = dict(zip(args, values))
            bound["result"] = op(*(bound[a] for a in args if a not in kwarg_only),
                                 **{a: bound[a] for a in kwarg_only})
            tensors = [n for n in saved if isinstance(bound[n], torch.Tensor)]
            if tensors_as_attributes:    # ctx.self = self instead of save_for_backward
                tensors = []
            wrap = lying if lie_about_saved else (lambda t: t)
            ctx.save_for_backward(*(wrap(bound[n]) for n in tensors))
            ctx.saved_names = tuple(tensors)
            for n in saved:
                if n not in tensors:
                    setattr(ctx, n, bound[n])
            for a in args:
                setattr(ctx, f"{a}_scalar_type", torch.float64)
            return bound["result"]

        def backward(ctx, grad):
            plain = [t.as_subclass(torch.Tensor) for t in ctx.saved_tensors]  # (the liar's too)
            env = dict(zip(ctx.saved_names, plain), grad=grad)
            for n in used - env.keys():
                env[n] = (getattr(ctx, n) if n in saved or n.endswith("_scalar_type")
                          else manual.get(n, getattr(torch.ops.aten, n, None)))
            return tuple(eval(formulas[a][0], {}, env) if a in formulas else None for a in args)

        return type(base.title(), (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "backward": staticmethod(backward)})

    return generate_backward


def _hard_coded(entry):
    """Formulas typed in for the public ops, not read from the entry."""
    formulas = {
        "sin": (("self",), lambda g, s: (g * s["self"].cos(),)),
        "exp": (("result",), lambda g, s: (g * s["result"],)),
        "mul.Tensor": (("self", "other"), lambda g, s: (g * s["other"], g * s["self"])),
        "add.Tensor": ((), lambda g, s: (g, g * s["alpha"], None)),
        "pow.Tensor_Scalar": (("self",), lambda g, s: (
            g * s["exponent"] * s["self"].pow(s["exponent"] - 1), None)),
    }
    name = entry["name"].split("(")[0]
    names, formula = formulas[name]
    base, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, base), overload or "default")

    class Generated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *values):
            out = op(*values[:2]) if name != "add.Tensor" else op(*values[:2], alpha=values[2])
            bound = {"self": values[0], "other": values[1] if len(values) > 1 else None,
                     "result": out}
            ctx.save_for_backward(*(bound[n] for n in names))
            ctx.saved_names = names
            if name == "add.Tensor":
                ctx.alpha = values[2]
            if name == "pow.Tensor_Scalar":
                ctx.exponent = values[1]
            return out

        @staticmethod
        def backward(ctx, grad):
            s = dict(zip(ctx.saved_names, ctx.saved_tensors))
            s.update({k: v for k, v in vars(ctx).items() if k in ("alpha", "exponent")})
            return formula(grad, s)

    return Generated


def _asks_torch(reference):
    """The reference's forward (so it saves the right things), but a backward that runs
    torch.autograd.grad through the real op, recorded in forward on detached copies."""

    def generate_backward(entry):
        Ref = reference(entry)
        name = entry["name"].split("(")[0]
        base, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")
        schema = op._schema.arguments

        class AsksTorch(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *values):
                out = Ref.forward(ctx, *values)
                with torch.enable_grad():
                    copies = [v.detach().requires_grad_() if isinstance(v, torch.Tensor) else v
                              for v in values]
                    ctx.real = (op(*[c for a, c in zip(schema, copies) if not a.kwarg_only],
                                   **{a.name: c for a, c in zip(schema, copies) if a.kwarg_only}),
                                copies)
                return out

            @staticmethod
            def backward(ctx, grad):
                real, copies = ctx.real
                tensors = [c for c in copies if isinstance(c, torch.Tensor)]
                grads = iter(torch.autograd.grad(real, tensors, grad, allow_unused=True))
                return tuple(next(grads) if isinstance(c, torch.Tensor) else None for c in copies)

        return AsksTorch

    return generate_backward


def _lying_gradients(reference):
    """The reference's node, with gradients that claim to be close to anything."""

    def generate_backward(entry):
        Ref = reference(entry)

        class Lying(torch.autograd.Function):
            forward = staticmethod(Ref.forward)

            @staticmethod
            def backward(ctx, grad):
                return tuple(None if g is None else lying(g * 0) for g in Ref.backward(ctx, grad))

        return Lying

    return generate_backward


def _lying_names(reference):
    """The reference's node, with ctx.saved_names a list that equals anything."""

    def generate_backward(entry):
        Ref = reference(entry)

        class LyingNames(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *values):
                out = Ref.forward(ctx, *values)
                ctx.saved_names = LyingList(ctx.saved_names)
                return out

            backward = staticmethod(Ref.backward)

        return LyingNames

    return generate_backward


WRONG = {
    "result bound to the input self": (dict(result_is_self=True), "the gradient for `self`"),
    "saves every argument and the output": (dict(save_all=True), "the op's own node"),
    "x.scalar_type() saves x": (dict(scalar_type_saves_x=True), "needs x's dtype, not x"),
    "only the first input's formula": (dict(first_input_only=True), "no gradient for `other`"),
    "tensors kept as ctx attributes": (dict(tensors_as_attributes=True),
                                       "you kept the tensor `self` as a ctx attribute"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_generators_fail(name, manual):
    flaws, phrase = WRONG[name]
    assert_rejected(EX, _generator(manual, **flaws), phrase, seed=0)


def test_formulas_typed_in_for_the_public_ops_fail_the_hidden_ops():
    assert run_checks(EX, _hard_coded, seed=0, hidden=False).status == "passed"
    assert_rejected(EX, _hard_coded, "KeyError", seed=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_backward_that_asks_torch_for_the_gradient_is_refused(seed, reference):
    answer = _asks_torch(reference)
    assert run_checks(EX, answer, seed=seed, hidden=False).status == "passed"
    assert_rejected(EX, answer, "the formula text, not the op, says the gradient", seed=seed)


def test_not_a_function_class(reference):
    assert_rejected(EX, lambda entry: reference(entry).apply, "torch.autograd.Function")


def test_the_aten_op_itself_is_not_a_generated_node():
    def generate_backward(entry):
        base, _, overload = entry["name"].split("(")[0].partition(".")
        op = getattr(getattr(torch.ops.aten, base), overload or "default")

        class JustTheOp(torch.autograd.Function):
            apply = staticmethod(lambda *values: op(*values))

        return JustTheOp

    assert_rejected(EX, generate_backward, "not your Function's node")


# ------------------------------------------------------------------ lying answers
def test_lying_answers_are_refused_for_their_type(reference, manual):
    assert_rejected(EX, _lying_gradients(reference), "subclass of Tensor")
    assert_rejected(EX, _lying_names(reference), "subclass of list")
    assert_rejected(EX, _generator(manual, lie_about_saved=True),
                    "the tensor you saved as `self` has type LyingTensor")


# ------------------------------------------------------------------ the reference
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed, reference):
    v = run_checks(EX, reference, seed=seed, hidden=True)
    assert v.status == "passed", v.message
