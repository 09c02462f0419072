"""compile.dynamic-shapes: plausible wrong shape_guards and checked functions fail, called
directly through run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import inspect

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.source import LocalSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import Dim
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from labs.compile.probes import _Forward
from tests.conftest import assert_rejected

EX = "compile.dynamic-shapes"


@pytest.fixture
def ref(reference):
    return reference(EX)


def _with(ref, **parts):
    return {**ref, **parts}


def _traced(fn, example_args, dynamic_dims, dynamic=DimDynamic.DYNAMIC, **settings):
    """The reference's tracing, with another kind of symbol or ShapeEnv settings: (shape env,
    fakes)."""
    shape_env = ShapeEnv(**settings)
    mode = FakeTensorMode(shape_env=shape_env)
    fakes = []
    for name, t, dims in zip(inspect.signature(fn).parameters, example_args, dynamic_dims):
        sizes = [dynamic if d in dims else DimDynamic.STATIC for d in range(t.dim())]
        fakes.append(mode.from_tensor(t, source=LocalSource(name),
                                      symbolic_context=StatelessSymbolicContext(sizes)))
    with mode:
        fn(*fakes)
    return shape_env, fakes


def _by_produce_guards(**kwargs):
    def shape_guards(fn, example_args, dynamic_dims):
        shape_env, fakes = _traced(fn, example_args, dynamic_dims, **kwargs)
        code = shape_env.produce_guards_expression(fakes, ignore_static=False)
        return lambda *new: code is None or shape_env.evaluate_guards_expression(code, new)
    return shape_guards


def guards_without_ranges(fn, example_args, dynamic_dims):
    """shape_env.guards, with the replacements applied, substituted with the new sizes (a symbol
    two sizes share must get one value), and the static sizes compared; but not each symbol's
    range (2 <= s0)."""
    shape_env, fakes = _traced(fn, example_args, dynamic_dims)

    def accepts(*new):
        values = {}
        for fake, t in zip(fakes, new):
            for s, n in zip(fake.shape, t.shape):
                if not isinstance(s, torch.SymInt):
                    if s != n:
                        return False
                elif values.setdefault(s.node.expr, n) != n:
                    return False
        return all(bool(g.expr.xreplace(shape_env.replacements).xreplace(values))
                   for g in shape_env.guards)
    return accepts


def eager_runs(fn, example_args, dynamic_dims):
    """Accepts what runs eagerly, with the static sizes kept."""
    def accepts(*new):
        for t, n, dims in zip(example_args, new, dynamic_dims):
            if any(a != b for d, (a, b) in enumerate(zip(t.shape, n.shape)) if d not in dims):
                return False
        try:
            fn(*new)
        except RuntimeError:
            return False
        return True
    return accepts


def by_compiling(fn, example_args, dynamic_dims):
    """Asks Dynamo: compiles, then reads the cache entry's guards."""
    torch._dynamo.reset()
    args = [t.clone() for t in example_args]
    for t, dims in zip(args, dynamic_dims):
        for d in dims:
            torch._dynamo.maybe_mark_dynamic(t, d)
    torch.compile(fn, backend="eager")(*args)
    (entry,) = _debug_get_cache_entry_list(fn.__code__)
    names = list(inspect.signature(fn).parameters)
    return lambda *new: entry.guard_manager.check(dict(zip(names, new)))


def by_exporting(fn, example_args, dynamic_dims):
    """Asks torch.export: exports with the marked dims Dim.AUTO and runs the program."""
    spec = tuple({d: Dim.AUTO for d in dims} or None for dims in dynamic_dims)
    program = torch.export.export(_Forward(fn), tuple(example_args),
                                  dynamic_shapes=(spec,)).module()

    def accepts(*new):
        try:
            program(*new)
        except Exception:  # noqa: BLE001
            return False
        return True
    return accepts


@pytest.mark.parametrize("shape_guards, phrase", [
    (by_compiling, "your answer ran torch/_dynamo/convert_frame.py"),
    (by_exporting, "your answer ran torch/export/_trace.py"),
    (eager_runs, "you said True, but Dynamo's guards refuse them: `2 <= L['x'].size()[0]`"),
    (guards_without_ranges, "you said True, but Dynamo's guards refuse them: `2 <= "),
    (_by_produce_guards(specialize_zero_one=False), "you said True"),
    (lambda fn, args, dims: (lambda *new: 1), "accepts returned a value of type int, not a bool"),
    (lambda fn, args, dims: True, "shape_guards returned a bool; it returns a function"),
])
def test_wrong_shape_guards_fail(ref, shape_guards, phrase):
    assert_rejected(EX, _with(ref, shape_guards=shape_guards), phrase)


def test_duck_sizing_fails_on_a_square_example(ref):
    """Symbols as dynamic=True makes them (DimDynamic.DUCK: equal example sizes share one)
    pass the public cases but not a square matmul with only x marked."""
    duck = _by_produce_guards(dynamic=DimDynamic.DUCK)
    v = assert_rejected(EX, _with(ref, shape_guards=duck), "a symbol of its own")
    assert v.message.startswith("hidden check 3/5"), v.message
    assert "project(x, w) traced on x (3, 3), w (3, 2)" in v.message, v.message


def test_forgetting_the_static_sizes_fails(ref):
    """produce_guards with ignore_static=True leaves out the static sizes: a marked size that a
    broadcast against a static 4 specialized is accepted at 5."""
    def ignore_static(fn, example_args, dynamic_dims):
        shape_env, fakes = _traced(fn, example_args, dynamic_dims)
        code = shape_env.produce_guards_expression(fakes, ignore_static=True)
        return lambda *new: code is None or shape_env.evaluate_guards_expression(code, new)

    assert_rejected(EX, _with(ref, shape_guards=ignore_static),
                    "x (5, 3), y (4, 3) you said True, but Dynamo's guards refuse them: `tensor "
                    "'L['x']' size mismatch at index 0. expected 4, actual 5`")


def test_not_a_dict_or_a_missing_part_is_named(ref):
    assert_rejected(EX, ref["shape_guards"], "dynamic_shapes has type function, not a dict")
    assert_rejected(EX, {"shape_guards": ref["shape_guards"]}, "dynamic_shapes has no 'checked'")
    assert_rejected(EX, _with(ref, checked={"top_rows": ref["checked"]["top_rows"]}),
                    "has no function for 'positive_mean', 'regroup'")


# ------------------------------------------------------------------ checked
def top_rows_unchecked(x, n):
    k = n.item()
    if k < 1 or k > x.shape[0]:
        raise ValueError("out of range")
    return x[x.sum(1).topk(k).indices]


def top_rows_dropped(x, n):
    """The validation removed: exports, but k = 0 returns an empty tensor."""
    k = n.item()
    return x[x.sum(1).topk(k).indices]


def top_rows_chained(x, n):
    """One chained comparison: Python's `and` asks for a bool of the first."""
    k = n.item()
    torch._check(1 <= k <= x.shape[0])
    return x[x.sum(1).topk(k).indices]


def top_rows_too_strict(x, n):
    """k >= 2: refuses k = 1, which keeps the promise."""
    k = n.item()
    torch._check(k >= 2)
    torch._check(k <= x.shape[0])
    return x[x.sum(1).topk(k).indices]


def positive_mean_dropped(x):
    """The check removed: no positive entry gives nan, not an error."""
    return x[x > 0].mean()


def positive_mean_clamped(x):
    """Avoids the data-dependent size instead of stating it: another value (a mean over all
    entries, zeros included)."""
    return x.clamp(min=0).sum() / (x > 0).sum().clamp(min=1)


@pytest.mark.parametrize("name, fn, phrase", [
    ("top_rows", top_rows_unchecked,
     "exporting checked['top_rows'] on x (8, 5), n = 8 failed"),
    ("top_rows", top_rows_unchecked,
     "GuardOnDataDependentSymNode: Could not guard on data-dependent expression u0 < 1"),
    ("top_rows", top_rows_chained, "GuardOnDataDependentSymNode"),
    ("top_rows", top_rows_dropped, "returned a value instead of refusing"),
    ("top_rows", top_rows_too_strict, "(which keeps the promise) raised RuntimeError"),
    ("positive_mean", positive_mean_dropped, "no positive entry (which breaks the promise"),
])
def test_wrong_checked_functions_fail(ref, name, fn, phrase):
    checked = {**ref["checked"], name: fn}
    assert_rejected(EX, _with(ref, checked=checked), phrase)


def test_a_rewrite_without_the_unbacked_size_must_still_refuse(ref):
    checked = {**ref["checked"], "positive_mean": positive_mean_clamped}
    v = assert_rejected(EX, _with(ref, checked=checked), "returned a value instead of refusing")
    assert "checked['positive_mean']" in v.message


def test_compiling_then_resetting_the_frame_counter_is_still_seen(reference):
    """From a red-team trial: the frame count is the answer's to rewrite; Dynamo compiling a
    frame (convert_frame) is seen while the answer runs, whatever the counters say."""
    from torch._dynamo.utils import counters

    ref = reference(EX)

    def shape_guards(fn, example_args, dynamic_dims):
        before = counters["frames"]["total"]
        args = [a.clone() for a in example_args]
        for a, dims in zip(args, dynamic_dims):
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(a, d)
        torch._dynamo.reset()
        torch.compile(fn, backend="eager", fullgraph=True)(*args)
        counters["frames"]["total"] = before
        entry = _debug_get_cache_entry_list(fn.__code__)[0]
        names = list(inspect.signature(fn).parameters)
        return lambda *new: bool(entry.guard_manager.check(dict(zip(names, new))))

    assert_rejected(EX, {**ref, "shape_guards": shape_guards}, "torch/_dynamo/convert_frame.py")
