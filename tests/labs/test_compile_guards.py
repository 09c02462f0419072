"""compile.guards: plausible wrong would_recompile functions fail, called directly through
run_checks. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import inspect

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from tests.conftest import assert_rejected

EX = "compile.guards"


def _compile_on(fn, args):
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    compiled(*args)
    return compiled


def _by_guards(bind):
    """The right method, with the frame's locals made by ``bind(fn, new_args)``."""
    def would_recompile(fn, args, new_args):
        _compile_on(fn, args)
        f_locals = bind(fn, new_args)
        return not any(e.guard_manager.check(f_locals) for e in _debug_get_cache_entry_list(fn))
    return would_recompile


def _bind_with_defaults(fn, new_args):
    bound = inspect.signature(fn).bind(*new_args)
    bound.apply_defaults()
    return dict(bound.arguments)


def _bind_without_defaults(fn, new_args):
    return dict(zip(inspect.signature(fn).parameters, new_args))


def _flat(args):
    return [b for a in args for b in (a if isinstance(a, (list, tuple)) else [a])]


def shapes_only(fn, args, new_args):
    _compile_on(fn, args)
    shape = lambda v: tuple(v.shape) if isinstance(v, torch.Tensor) else None
    return [shape(a) for a in _flat(args)] != [shape(a) for a in _flat(new_args)]


def tensor_metadata_only(fn, args, new_args):
    """Shapes, dtypes, requires_grad and strides: forgets the Python constants."""
    _compile_on(fn, args)

    def meta(v):
        if isinstance(v, torch.Tensor):
            return v.shape, v.dtype, v.requires_grad, v.stride()
        return type(v)

    return [meta(a) for a in _flat(args)] != [meta(a) for a in _flat(new_args)]


def everything(fn, args, new_args):
    """Values too: any difference at all."""
    _compile_on(fn, args)

    def same(a, b):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return (a.shape, a.dtype, a.stride(), a.requires_grad) == (
                b.shape, b.dtype, b.stride(), b.requires_grad) and torch.equal(a, b)
        return type(a) is type(b) and a == b

    a, b = _flat(args), _flat(new_args)
    return len(a) != len(b) or not all(same(u, v) for u, v in zip(a, b))


def by_calling(fn, args, new_args):
    """Asks the cache by calling it: compiles new_args too."""
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["frames"]["ok"]
    compiled = torch.compile(fn, backend="eager")
    compiled(*args)
    compiled(*new_args)
    return torch._dynamo.utils.counters["frames"]["ok"] - before > 1


def by_calling_then_clearing(fn, args, new_args):
    """by_calling, then Dynamo's counters cleared and its caches reset: hides from
    ``counters["frames"]``, not from the check's own count."""
    answer = by_calling(fn, args, new_args)
    torch._dynamo.utils.counters.clear()
    torch._dynamo.reset()
    return answer


def by_calling_uncounted(fn, args, new_args):
    """by_calling with Dynamo's frame compiler swapped for a wrapper of the answer's own."""
    from torch._dynamo import convert_frame

    original = convert_frame._compile
    convert_frame._compile = lambda *a, **k: original(*a, **k)
    return by_calling(fn, args, new_args)  # (and leaves it swapped)


def by_stance(fn, args, new_args):
    """Compiles on args, then asks Dynamo itself: under the fail_on_recompile stance a call on
    new_args raises when the guards fail (public API, and not one frame more)."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager")
    compiled(*args)
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            compiled(*new_args)
    except Exception:
        return True
    return False


def by_hand(fn, args, new_args, skip_unused=False):
    """A careful comparison of the arguments instead of the guards: shapes (but the dims marked
    dynamic), dtypes, requires_grad, contiguity, the Python values (with ``skip_unused``, not
    ``ignores_y``'s y). Passes the public cases."""
    _compile_on(fn, args)
    if skip_unused and fn.__name__ == "ignores_y":
        args, new_args = args[:1], new_args[:1]

    def meta(a, old):
        if isinstance(a, torch.Tensor):
            marked = getattr(old, "_dynamo_dynamic_indices", set())
            shape = [None if i in marked else n for i, n in enumerate(a.shape)]
            return shape, a.dtype, a.requires_grad, a.is_contiguous()
        return type(a), a

    a, b = _flat(args), _flat(new_args)
    return len(a) != len(b) or any(meta(u, u) != meta(v, u) for u, v in zip(a, b))


def test_comparing_arguments_by_hand_fails_on_the_boundaries():
    for seed in (0, 1):
        v = assert_rejected(EX, by_hand, "never reads", seed=seed)
        assert v.passed == 1 and v.message.startswith(  # (the public check passed)
            "hidden check 2/3 'agrees with the cache where comparing"), v.message


def test_a_hand_comparison_that_skips_unused_arguments_fails_on_strides_or_mark_dynamic():
    def skips_unused(fn, args, new_args):
        return by_hand(fn, args, new_args, skip_unused=True)

    v = assert_rejected(EX, skips_unused, "you said False, but the second call recompiles")
    assert "stride mismatch at index 1" in v.message, v.message


def test_an_inverted_answer_is_told_so():
    def inverted(fn, args, new_args):
        return not _by_guards(_bind_with_defaults)(fn, args, new_args)

    assert_rejected(EX, inverted, "the opposite of the cache's on all 9 cases")


def test_the_right_method_passes():
    from grader.checks import run_checks

    v = run_checks(EX, _by_guards(_bind_with_defaults), seed=4)
    assert v.status == "passed", v.message


@pytest.mark.parametrize("answer, phrase", [
    (shapes_only, ("a new dtype: scaled_sum(tensor (4, 3) float32, 2), then scaled_sum(tensor "
                   "(4, 3) float64, 2), you said False")),
    (tensor_metadata_only, "guard check says: `L['scale'] == 2`"),
    (everything, "the same shape, new values"),
    (lambda fn, args, new_args: False, "you said False"),
    (lambda fn, args, new_args: True, "you said True"),
    (by_calling, "compile fn once, on args; answer from its guards"),
    (by_calling_then_clearing, "compile fn once, on args; answer from its guards"),
    (by_calling_uncounted, "put something else in place of Dynamo's frame compiler"),
    (by_stance, "your answer ran torch/_dynamo/eval_frame.py: _set_stance"),
    (lambda fn, args, new_args: int(shapes_only(fn, args, new_args)), "has type int"),
])
def test_wrong_answers_fail(answer, phrase):
    assert_rejected(EX, answer, phrase)


def test_forgetting_the_defaults_fails_on_a_hidden_case():
    for seed in (0, 1):  # (a fixed hidden case, whatever the seed)
        v = assert_rejected(EX, _by_guards(_bind_without_defaults), "to its default", seed=seed)
    assert "hidden" in v.message
