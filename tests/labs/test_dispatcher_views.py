"""dispatcher.views: plausible wrong geometries fail, called directly through run_checks (milliseconds).
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import math
import threading

import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes

from grader.checks import run_checks
from labs.dispatcher.checks.views import _apply
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingList

EX = "dispatcher.views"


# ------------------------------------------------------------------ plausible wrong answers
def _geometry(flaw=None):
    """Arithmetic view geometry with one deliberate flaw, chosen by name."""
    def row_major(sizes):
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.append(acc)
            acc *= max(s, 1)
        return strides[::-1]

    def wrap(d, n):
        return d + n if d < 0 else d

    def view_geometry(shape, ops):
        sizes, strides, offset, shares = list(shape), row_major(shape), 0, True
        out = []
        for op in ops:
            kind, ndim = op[0], len(sizes)
            if kind == "transpose":
                a, b = wrap(op[1], ndim), wrap(op[2], ndim)
                sizes[a], sizes[b] = sizes[b], sizes[a]
                strides[a], strides[b] = strides[b], strides[a]
            elif kind == "permute":
                dims = [wrap(d, ndim) for d in op[1]]
                sizes, strides = [sizes[d] for d in dims], [strides[d] for d in dims]
            elif kind == "slice":
                _, dim, start, stop, step = op
                dim = wrap(dim, ndim)
                n = sizes[dim]
                start = 0 if start is None else start + n if start < 0 else start
                stop = n if stop is None else stop + n if stop < 0 else stop
                if flaw != "no clamping":
                    start = min(max(start, 0), n)
                    stop = min(max(stop, start), n)
                offset += start * strides[dim]
                if flaw == "float ceil":
                    sizes[dim] = max(0, math.ceil((stop - start) / step))
                else:
                    sizes[dim] = max(0, (stop - start + step - 1) // step)
                if flaw != "step keeps the stride":
                    strides[dim] *= step
            elif kind == "select":
                dim = wrap(op[1], ndim)
                offset += wrap(op[2], sizes[dim]) * strides[dim]
                del sizes[dim], strides[dim]
            elif kind == "unsqueeze":
                dim = wrap(op[1], ndim + 1)
                new = 1 if dim >= ndim or flaw == "unsqueeze stride 1" else sizes[dim] * strides[dim]
                sizes.insert(dim, 1)
                strides.insert(dim, new)
            elif kind == "expand":
                target = list(op[1])
                ns, nst = [0] * len(target), [0] * len(target)
                for i in range(len(target) - 1, -1, -1):
                    j = i - (len(target) - ndim)
                    if j >= 0:
                        size, stride = sizes[j], strides[j]
                    elif flaw == "new leading dims stride 0":
                        size, stride = 1, 0
                    else:
                        size, stride = 1, ns[i + 1] * nst[i + 1] if i + 1 < len(target) else 1
                    want = size if target[i] == -1 else target[i]
                    if want != size and flaw != "expand keeps the stride":
                        stride = 0
                    ns[i], nst[i] = want, stride
                if ndim == 0 and flaw != "expand keeps the stride":
                    nst = [0] * len(target)
                sizes, strides = ns, nst
            elif kind == "as_strided":
                _, s, st, off = op
                sizes, strides = list(s), list(st)
                if flaw == "as_strided offset relative":
                    offset += off or 0
                else:
                    offset = offset if off is None else off
            elif kind == "contiguous":
                expected, ok = 1, True
                for s, st in zip(reversed(sizes), reversed(strides)):
                    if s == 1 and flaw != "size-1 strides count":
                        continue
                    if st != expected:
                        ok = False
                        break
                    expected *= s
                if 0 in sizes:
                    ok = True
                if not ok or flaw == "contiguous always copies":
                    strides, offset, shares = row_major(sizes), 0, False
            out.append((tuple(sizes), tuple(strides), offset, shares))
        return out
    return view_geometry


def _asks_torch(shape, ops):
    """Right numbers, but obtained by applying the ops to a real tensor."""
    from labs.dispatcher.checks.views import torch_geometry
    base = torch.empty(shape)
    del base
    return torch_geometry(shape, ops)


def _read_back(t, ops):
    """Apply ``ops`` to the tensor ``t`` and read each result's geometry back from torch."""
    original = t.untyped_storage()._cdata
    out = []
    for op in ops:
        t = _apply(t, op)
        out.append((tuple(t.shape), t.stride(), t.storage_offset(),
                    t.untyped_storage()._cdata == original))
    return out


def _with_modes_disabled(make):
    """Asks torch for the geometry with the current dispatch modes popped, so that the checks'
    op-detecting mode sees nothing; ``make(shape)`` builds the starting tensor."""
    def view_geometry(shape, ops):
        with _disable_current_modes():
            return _read_back(make(shape), ops)
    return view_geometry


def _with_dispatch_disabled(shape, ops):
    """Asks torch with Python dispatch switched off altogether (no mode, no subclass is called)."""
    with torch._C._DisableTorchDispatch():
        return _read_back(torch.empty(shape, device="meta"), ops)


def _in_a_thread(shape, ops):
    """Asks torch in another thread, whose dispatch-mode stack is empty (it is thread-local)."""
    result = {}

    def work():
        try:
            result["value"] = _read_back(torch.empty(shape, device="meta"), ops)
        except Exception as exc:  # re-raised in the caller's thread
            result["error"] = exc
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _lists_not_tuples(shape, ops):
    """Returns (sizes, strides, offset) only: forgets the `shares` flag."""
    return [entry[:3] for entry in _geometry()(shape, ops)]


WRONG = {
    "slicing with a step keeps the stride": (_geometry("step keeps the stride"), "multiplied by"),
    "expand keeps the stride of grown dims": (_geometry("expand keeps the stride"), "stride 0"),
    "new leading size-1 dims get stride 0": (_geometry("new leading dims stride 0"), "expand"),
    "unsqueeze always gives stride 1": (_geometry("unsqueeze stride 1"), "inferUnsqueezeGeometry"),
    "slice start/stop not clamped": (_geometry("no clamping"), "clamped"),
    "as_strided offset added to the current one": (_geometry("as_strided offset relative"), "storage"),
    "contiguous() always copies": (_geometry("contiguous always copies"), "contiguous"),
    "size-1 dims count for contiguity": (_geometry("size-1 strides count"), "_compute_contiguous"),
    "calls torch view ops": (_asks_torch, "called torch operators"),
    "slice sizes with float division": (_geometry("float ceil"), "never with / or math.ceil"),
    "no shares flag": (_lists_not_tuples, "(sizes, strides, offset, shares)"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name, seed):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=seed)


# Answers that get the geometry from torch instead of computing it: each gets past the checks'
# op-detecting mode, and each fails because shapes beyond int64 exist for no tensor, whatever way
# torch is asked (the kind is closed by what is asked, not by watching how).
FROM_TORCH = {
    "real tensors, modes disabled": _with_modes_disabled(torch.empty),
    "meta tensors, modes disabled": _with_modes_disabled(lambda s: torch.empty(s, device="meta")),
    "as_strided on a fresh tensor, modes disabled": _with_modes_disabled(
        lambda s: torch.empty(0, device="meta").as_strided(
            s, torch.empty(s, device="meta").stride())),
    "torch.empty(n).view(shape), modes disabled": _with_modes_disabled(
        lambda s: torch.empty(math.prod(s), device="meta").view(s)),
    "meta tensors, Python dispatch disabled": _with_dispatch_disabled,
    "meta tensors in another thread": _in_a_thread,
}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(FROM_TORCH))
def test_answers_that_ask_torch_fail(name, seed):
    answer = FROM_TORCH[name]
    assert answer((2, 3), [("transpose", 0, 1), ("slice", 0, 1, None, 2)]) == [
        ((3, 2), (1, 3), 0, True), ((1, 2), (2, 3), 1, True)]   # right wherever torch can answer
    v = assert_rejected(EX, answer, "sizes above 2**64", seed=seed)
    assert "beyond" in v.message or "above 2**64" in v.message, v.message


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_passes(seed):
    v = run_checks(EX, load_answer(EX), seed=seed, hidden=True)
    assert v.status == "passed", v.message


# ------------------------------------------------------------------ lying answers
class _AnyInt(int):
    """An int that claims to equal anything."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = int.__hash__


class _AnyEntry(tuple):
    """A tuple that claims to equal anything."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    __hash__ = tuple.__hash__


def _claims_one_entry_per_op(shape, ops):
    """Computes nothing: an empty list subclass that claims to hold one entry per op (a check that
    zips over it sees no entry to compare)."""
    return LyingList(claims=len(ops))


def _entries_that_equal_anything(shape, ops):
    """One made-up entry per op, a tuple subclass that claims to equal anything."""
    return [_AnyEntry(((0,), (0,), 0, True)) for _ in ops]


def _sizes_that_equal_anything(shape, ops):
    """The offsets and strides of a flawed geometry (steps keep the stride), with sizes that are
    ints claiming to equal anything."""
    return [(tuple(_AnyInt(s) for s in sizes), strides, _AnyInt(offset), shares)
            for sizes, strides, offset, shares in _geometry("step keeps the stride")(shape, ops)]


LYING = {
    "an empty list that claims one entry per op": (_claims_one_entry_per_op, "subclass of list"),
    "entries that equal anything": (_entries_that_equal_anything, "subclass of tuple"),
    "ints that equal anything": (_sizes_that_equal_anything, "subclass of int"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    ops = [("transpose", 0, 1)]
    got = _claims_one_entry_per_op((2, 3), ops)
    assert len(got) == len(ops) and list(zip(ops, got)) == []
    assert _entries_that_equal_anything((2,), [("contiguous",)]) == [((2,), (1,), 0, True)]
    assert _AnyInt(0) == 5


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name, seed):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=seed)


def test_honest_variants_of_the_result_still_pass():
    """Exact types are required, but lists instead of tuples, a tuple of entries, torch.Size sizes
    (within int64) and integral float offsets (within float's exact integers) are not refused."""
    view_geometry = _geometry()

    def variant(shape, ops):
        return tuple([torch.Size(sizes) if max(sizes, default=0) < 2**63 else sizes,
                      list(strides), float(offset) if offset < 2**53 else offset, shares]
                     for sizes, strides, offset, shares in view_geometry(shape, ops))
    for seed in (0, 1):
        v = run_checks(EX, variant, seed=seed, hidden=True)
        assert v.status == "passed", v.message
