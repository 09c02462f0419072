"""Checks of ``dispatcher.views``: ``view_geometry(shape, ops)`` predicts, by arithmetic alone, the
sizes, strides and storage offset after each op of a chain of views, and whether the result still
uses the original tensor's storage.

The oracle is torch: the same chain is applied to a real contiguous tensor of ``shape`` and each
result's ``size()``, ``stride()``, ``storage_offset()`` and storage identity are read back. Chains
and shapes are drawn from ``random.Random`` seeded by the run's seed. The answer runs under a
dispatch mode that notices any aten operator it calls (a readable message for the common slip).

What closes the door on answers that get the geometry from torch instead of computing it (with
the dispatch modes disabled, on meta tensors, in another thread...) is the design of the
``beyond_int64`` checks, not a list of forbidden calls: their shapes have sizes above 2**64, which
torch cannot represent at all (sizes and strides are int64 in ``c10/core/TensorImpl.h``, on every
device), so only the answer's own integer arithmetic can give them. Their oracle is still torch:
each size of such a shape is ``a * M + b`` for one huge ``M``; torch runs the chain on meta tensors
for six ordinary values of ``M``, every size, stride and offset it reports is a polynomial of
degree at most 3 in ``M`` there (one degree per huge dim), the polynomial through four of the
points must reproduce the other two, and evaluated at the huge ``M`` it gives torch's geometry.
"""
from __future__ import annotations

import random
from fractions import Fraction

from grader.checks import AnswerRaised, CheckFailure, check, exact
from labs.dispatcher import probes

EXERCISE = "dispatcher.views"
MAX_DIMS = 6

_HINTS = {
    "transpose": "transpose(d0, d1) swaps entries d0 and d1 of both sizes and strides (negative "
                 "dims count from the end); nothing else changes.",
    "permute": "permute(dims) reorders sizes and strides: entry i of the result is entry dims[i] of "
               "the input (negative dims count from the end).",
    "slice": "slice(dim, start, stop, step) follows Python slicing: None means the ends, a negative "
             "start/stop gets size added, then both are clamped into [0, size] and stop is raised to "
             "at least start. The new size is ceil((stop - start) / step), the stride is multiplied by "
             "step, and the offset grows by start * stride, even when the slice is empty "
             "(torch/_decomp/decompositions.py: slice_forward).",
    "select": "select(dim, index) drops dim; a negative index gets size added, and the offset grows "
              "by index * stride[dim].",
    "unsqueeze": "unsqueeze(dim) takes dim in [-ndim-1, ndim] (negative: add ndim + 1) and inserts a "
                 "size-1 dim whose stride is sizes[dim] * strides[dim], or 1 when it becomes the last "
                 "dim (torch/_meta_registrations.py: inferUnsqueezeGeometry).",
    "expand": "expand(sizes) aligns the sizes from the right. -1 keeps a dim; a size-1 dim grown to "
              "another size gets stride 0; new leading dims get stride 0, except a new leading dim of "
              "size 1, which gets (size * stride) of the dim after it; expanding a 0-d tensor gives "
              "stride 0 everywhere (aten/src/ATen/ExpandUtils.h: inferExpandGeometry).",
    "as_strided": "as_strided(sizes, strides, offset) replaces the geometry outright: strides and "
                  "offset are counted in elements of the storage, not relative to the current view; "
                  "offset None keeps the current storage offset.",
    "contiguous": "contiguous() returns the tensor itself (same geometry, same storage) when "
                  "is_contiguous() holds: no elements, or strides that match the row-major strides on "
                  "every dim of size != 1 (c10/core/Contiguity.h: _compute_contiguous). Otherwise it "
                  "copies into a new storage: offset 0, row-major strides, and from then on the "
                  "result no longer shares the original storage.",
}


# ------------------------------------------------------------------------ the oracle
def _apply(t, op):
    """Apply one op (as the exercise describes it) to tensor ``t`` with torch."""
    kind = op[0]
    if kind == "transpose":
        return t.transpose(op[1], op[2])
    if kind == "permute":
        return t.permute(*op[1])
    if kind == "slice":
        _, dim, start, stop, step = op
        index = [slice(None)] * t.dim()
        index[dim] = slice(start, stop, step)
        return t[tuple(index)]
    if kind == "select":
        return t.select(op[1], op[2])
    if kind == "unsqueeze":
        return t.unsqueeze(op[1])
    if kind == "expand":
        return t.expand(tuple(op[1]))
    if kind == "as_strided":
        _, size, stride, offset = op
        return t.as_strided(size, stride) if offset is None else t.as_strided(size, stride, offset)
    if kind == "contiguous":
        return t.contiguous()
    raise ValueError(kind)


def torch_geometry(shape, ops, device="cpu"):
    """What torch says: [(sizes, strides, offset, shares_original_storage)] after each op, on a
    float32 tensor of ``shape`` on ``device`` (``"meta"``: no memory, any int64 size)."""
    import torch

    base = torch.empty(shape, dtype=torch.float32, device=device)
    original = base.untyped_storage()._cdata
    out, t = [], base
    for op in ops:
        t = _apply(t, op)
        out.append((tuple(t.shape), tuple(t.stride()), int(t.storage_offset()),
                    t.untyped_storage()._cdata == original))
    return out


# ------------------------------------------------------------------------ random chains
def _dim(rng, ndim: int, extra: int = 0) -> int:
    """A dim in [-(ndim+extra), ndim+extra-1], negative half of the time."""
    d = rng.randrange(ndim + extra)
    return d - (ndim + extra) if rng.random() < 0.5 else d


def _random_op(rng, t):
    """A random op that is valid for tensor ``t`` (its current geometry decides)."""
    ndim, sizes = t.dim(), list(t.shape)
    kinds = ["contiguous"]
    if ndim:
        kinds += ["transpose", "permute", "slice", "slice"]
        if any(sizes):
            kinds.append("select")
    if ndim < MAX_DIMS:
        kinds += ["unsqueeze", "expand", "expand"]
    if t.untyped_storage().nbytes():
        kinds.append("as_strided")
    kind = rng.choice(kinds)
    if kind == "transpose":
        return ("transpose", _dim(rng, ndim), _dim(rng, ndim))
    if kind == "permute":
        perm = list(range(ndim))
        rng.shuffle(perm)
        return ("permute", tuple(p - ndim if rng.random() < 0.3 else p for p in perm))
    if kind == "slice":
        dim = _dim(rng, ndim)
        n = sizes[dim]

        def end():
            return None if rng.random() < 0.25 else rng.randint(-n - 2, n + 2)

        def where(e, default):              # the position an end stands for, before clamping
            return default if e is None else e + n if e < 0 else e
        start, stop = end(), end()
        if rng.random() < 0.7 and where(start, 0) > where(stop, n):
            start, stop = stop, start       # mostly non-empty slices; empty ones stay possible
        return ("slice", dim, start, stop, rng.choice((1, 1, 2, 2, 3, 4)))
    if kind == "select":
        dim = rng.choice([d for d in range(ndim) if sizes[d]])
        index = rng.randrange(sizes[dim])
        return ("select", dim - ndim if rng.random() < 0.4 else dim,
                index - sizes[dim] if rng.random() < 0.4 else index)
    if kind == "unsqueeze":
        return ("unsqueeze", _dim(rng, ndim, extra=1))
    if kind == "expand":
        new = [rng.choice((1, 1, 2, 3)) for _ in range(rng.randint(0, min(2, MAX_DIMS - ndim)))]
        old = []
        for s in sizes:
            if s == 1:
                old.append(rng.choice((-1, 1, 2, 3, 4, 0) if rng.random() < 0.1 else (-1, 1, 2, 3, 4)))
            else:
                old.append(rng.choice((-1, s)))
        return ("expand", tuple(new + old))
    if kind == "as_strided":
        capacity = t.untyped_storage().nbytes() // t.element_size()
        for _ in range(20):
            size = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 3)))
            stride = tuple(rng.randint(0, 4) for _ in size)
            extent = sum((s - 1) * st for s, st in zip(size, stride))
            if extent < capacity:
                if rng.random() < 0.3 and t.storage_offset() + extent < capacity:
                    return ("as_strided", size, stride, None)
                return ("as_strided", size, stride, rng.randrange(capacity - extent))
    return ("contiguous",)


def random_chain(rng, shape, length: int):
    """A chain of ``length`` ops, each valid for the tensor the previous ones produce."""
    import torch

    t = torch.empty(shape)
    ops = []
    for _ in range(length):
        op = _random_op(rng, t)
        ops.append(op)
        t = _apply(t, op)
    return ops


def random_shape(rng, *, zeros: bool = False):
    """1 to 4 dims of sizes 1..5 (some 0 when ``zeros``)."""
    low = 0 if zeros else 1
    return tuple(rng.choice((1, rng.randint(low, 5), rng.randint(low, 5))) for _ in range(rng.randint(1, 4)))


# ------------------------------------------------------------------------ comparing
def _fmt(entry) -> str:
    sizes, strides, offset, shares = entry
    return f"sizes {tuple(sizes)}, strides {tuple(strides)}, offset {offset}, shares {shares}"


def _number(value, what: str) -> int:
    """A size, stride or offset of the answer as a plain int. Exactly an int (or an integral float,
    as arithmetic with / can give); a subclass could lie about its value (__eq__, __int__)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        exact(value, (int, float), what)
        if type(value) is int:
            return value
        if value.is_integer():
            return int(value)
    raise CheckFailure(f"{what} is {_show(value)}; sizes, strides and offsets are ints.")


def _show(value) -> str:
    """repr() of the answer's value when it is a plain builtin, else just its type (a learner's
    object may print whatever it likes)."""
    return repr(value) if type(value) in (int, float, bool, str, type(None)) else f"a {type(value).__name__}"


def _normalize(entry, i: int, op):
    """The answer's entry as (tuple, tuple, int, bool), or a CheckFailure saying what is wrong.
    Every part must be of an exact builtin type before it is read: a tuple or int subclass could
    lie about its length, items or value."""
    shape_msg = (f"entry {i} of your result (for op {op}) is {{}}; each entry must be a tuple "
                 "(sizes, strides, offset, shares): two tuples of ints, an int and a bool.")
    if not isinstance(entry, (tuple, list)):
        raise CheckFailure(shape_msg.format(_show(entry)))
    exact(entry, (tuple, list), f"entry {i} of your result (for op {op})")
    if len(entry) != 4:
        raise CheckFailure(shape_msg.format(f"a {type(entry).__name__} of length {len(entry)}"))
    import torch

    sizes, strides, offset, shares = entry
    parts = []
    for name, seq in (("sizes", sizes), ("strides", strides)):
        if not isinstance(seq, (tuple, list)):
            raise CheckFailure(shape_msg.format(f"an entry whose {name} is {_show(seq)}"))
        exact(seq, (tuple, list, torch.Size), f"the {name} of entry {i} of your result (for op {op})")
        parts.append(tuple(_number(v, f"an element of the {name} of entry {i} of your result (for op {op})")
                           for v in seq))
    if type(shares) is not bool or isinstance(offset, bool):
        raise CheckFailure(
            f"entry {i} of your result (for op {op}) has offset {_show(offset)} and shares {_show(shares)}; "
            "offset must be an int and shares a bool (True or False).")
    offset = _number(offset, f"the offset of entry {i} of your result (for op {op})")
    return parts[0], parts[1], offset, shares


def compare(view_geometry, shape, ops, where: str, want=None) -> None:
    """Run the answer on (shape, ops) and compare, op by op, with ``want`` (torch's geometry on a
    real tensor of ``shape`` when None; the extrapolated one of a shape beyond int64 otherwise)."""
    huge = want is not None
    want = torch_geometry(shape, ops) if want is None else want
    try:
        seen = view_geometry.probe(probes.geometry, list(shape), [list(op) for op in ops])
    except AnswerRaised as exc:
        if not huge:
            raise
        first = (exc.evalue.strip().splitlines() or [""])[0][:200]
        raise CheckFailure(
            f"on {where}, view_geometry raised {exc.ename}: {first}"
            f"{exc.record.get('where', '')}. The shape {tuple(shape)} has sizes above 2**64: no "
            "tensor can have them, not even on the meta device (torch keeps sizes and strides in "
            "64-bit ints), so its geometry can only come from your own integer arithmetic, "
            "which Python does exactly at any size.") from None
    got, ran = seen["got"], seen["ops"]
    if ran:
        raise CheckFailure(
            f"view_geometry called torch operators ({', '.join(sorted(set(ran))[:4])}). Compute "
            "sizes, strides and offsets with integer arithmetic on Python tuples, without making "
            "tensors: that arithmetic is what the view kernels do.")
    if isinstance(got, (list, tuple)):             # a subclass could lie about its length or items
        exact(got, (list, tuple), f"on {where}, the value view_geometry returned")
    if not isinstance(got, (list, tuple)) or len(got) != len(ops):
        raise CheckFailure(
            f"on {where}, view_geometry returned {type(got).__name__}"
            f"{' of length ' + str(len(got)) if isinstance(got, (list, tuple)) else ''}; return a "
            f"list with one (sizes, strides, offset, shares) entry per op ({len(ops)} ops).")
    before = (tuple(shape), _contiguous_strides(shape), 0, True)
    for i, (op, entry, expected) in enumerate(zip(ops, got, want)):
        mine = _normalize(entry, i, op)
        if mine != expected:
            parts = [name for name, a, b in zip(("sizes", "strides", "offset", "shares"), mine, expected)
                     if a != b]
            note = ("(Sizes here are above 2**64, where only int arithmetic is exact: divide "
                    "with //, never with / or math.ceil, as floats skip integers above 2**53.) "
                    if huge else "")
            raise CheckFailure(
                f"on {where}: {note}starting from a contiguous tensor of shape {tuple(shape)}, op "
                f"#{i} {op} was applied to a tensor with {_fmt(before)}. Mismatch in "
                f"{'/'.join(parts)}: you have {_fmt(mine)}; torch has {_fmt(expected)}. "
                f"{_HINTS[op[0]]}")
        before = expected


# ------------------------------------------------------------------------ beyond int64
#: the ordinary values of m at which torch runs a huge case's chain (M = P * m); the polynomial
#: through the first _FIT of them must give torch's geometry at the others
_SAMPLES = (101, 103, 107, 109, 113, 127)
_FIT = 4
#: a dim longer than this (in a sample) is one of the huge dims; they get only small arguments
_LONG = 64


def _small_end(rng, n: int, long: bool):
    """A slice end: None, or an int that means the same position at every sample of a long dim."""
    if rng.random() < 0.25:
        return None
    if long:
        return rng.randint(0, 5) if rng.random() < 0.5 else -rng.randint(1, 5)
    return rng.randint(-n - 2, n + 2)


def _huge_op(rng, t, steps: list):
    """A random op for the meta tensor ``t`` (one sample of a huge case) whose arguments mean the
    same thing at every sample: on long dims only small starts, stops and indices, and -1 in
    expand. Slice steps on long dims are appended to ``steps`` (the samples' M is a multiple of
    their product, so that every size stays a polynomial in M)."""
    ndim, sizes = t.dim(), list(t.shape)
    kinds = ["contiguous", "contiguous"] + ["as_strided"] * (rng.random() < 0.3)
    if ndim:
        kinds += ["transpose", "permute", "slice", "slice", "slice", "select"]
    if ndim < MAX_DIMS:
        kinds += ["unsqueeze", "expand", "expand"]
    kind = rng.choice(kinds)
    if kind == "contiguous":
        return ("contiguous",)
    if kind == "transpose":
        return ("transpose", _dim(rng, ndim), _dim(rng, ndim))
    if kind == "permute":
        return ("permute", tuple(rng.sample(range(ndim), ndim)))
    if kind == "unsqueeze":
        return ("unsqueeze", _dim(rng, ndim, extra=1))
    if kind == "slice":
        dim = _dim(rng, ndim)
        long = sizes[dim] > _LONG
        step = rng.choice((1, 2, 3, 4)) if not long or _product(steps) <= 16 else 1
        if long:
            steps.append(step)
        return ("slice", dim, _small_end(rng, sizes[dim], long), _small_end(rng, sizes[dim], long),
                step)
    if kind == "select":
        dim = _dim(rng, ndim)
        n = sizes[dim]
        index = rng.randint(-5, 5) if n > _LONG else rng.randint(-n, n - 1) if n else 0
        return ("select", dim, index)
    if kind == "expand":
        new = [rng.choice((1, 1, 2, 3)) for _ in range(rng.randint(0, min(2, MAX_DIMS - ndim)))]
        old = [-1 if s > _LONG else rng.choice((-1, 1, 2, 3)) if s == 1 else rng.choice((-1, s))
               for s in sizes]
        return ("expand", tuple(new + old))
    size = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, 3)))
    stride = tuple(rng.randint(0, 4) for _ in size)
    return ("as_strided", size, stride, None if rng.random() < 0.4 else rng.randint(0, 40))


def _product(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _at(points, x):
    """The polynomial through ``points`` [(x_j, y_j)] (Lagrange's form, exact), evaluated at x."""
    total = Fraction(0)
    for j, (xj, yj) in enumerate(points):
        term = Fraction(yj)
        for k, (xk, _) in enumerate(points):
            if k != j:
                term *= Fraction(x - xk, xj - xk)
        total += term
    return total


def _extrapolate(samples, m):
    """Torch's geometry at m, from its geometry at each of _SAMPLES (``samples``, one list of
    (sizes, strides, offset, shares) per sample): None when the samples disagree on anything but
    the numbers, or a number is not the same polynomial of degree < _FIT at every sample."""
    out = []
    for entries in zip(*samples):
        sizes, _, _, shares = entries[0]
        if any((len(e[0]), e[3]) != (len(sizes), shares) for e in entries):
            return None
        numbers = []
        for series in zip(*[(*e[0], *e[1], e[2]) for e in entries]):
            points = list(zip(_SAMPLES, series))
            if any(_at(points[:_FIT], x) != y for x, y in points[_FIT:]):
                return None
            value = _at(points[:_FIT], m)
            if value.denominator != 1:
                return None
            numbers.append(int(value))
        n = len(sizes)
        out.append((tuple(numbers[:n]), tuple(numbers[n:2 * n]), numbers[2 * n], shares))
    return out


def huge_case(rng, length: int):
    """(shape, ops, torch's geometry) of a chain of ``length`` ops on a contiguous tensor whose
    huge dims are a * M + b long, for an M that puts them above 2**64."""
    import torch

    while True:
        ndim = rng.randint(1, 4)
        long = sorted(rng.sample(range(ndim), rng.randint(1, min(3, ndim))))
        dims = [(rng.randint(1, 3), rng.randint(0, 5)) if d in long else (0, rng.randint(1, 4))
                for d in range(ndim)]

        def shape_at(M, dims=dims):
            return tuple(a * M + b for a, b in dims)

        t = torch.empty(shape_at(64 * _SAMPLES[0]), device="meta")
        ops, steps = [], []
        while len(ops) < length:
            op = _huge_op(rng, t, steps)
            try:
                t = _apply(t, op)
            except (RuntimeError, IndexError, ValueError):
                continue
            ops.append(op)
        scale = _product(steps)
        try:
            samples = [torch_geometry(shape_at(scale * m), ops, "meta") for m in _SAMPLES]
        except (RuntimeError, IndexError, ValueError):
            continue
        m = 2**64 + rng.randrange(2**40)
        want = _extrapolate(samples, m)
        # (most results keep a number above int64: the chain must not be solvable in int64)
        if want is not None and 2 * sum(max(*e[0], *e[1], e[2], 0) >= 2**63 for e in want) > length:
            return shape_at(scale * m), ops, want


def _contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _rng(ctx, offset: int) -> random.Random:
    return random.Random(f"{EXERCISE}:{ctx.seed}:{offset}")


# ------------------------------------------------------------------------ checks
@check(EXERCISE)
def one_op_each(view_geometry, ctx):
    """each kind of op, once, on a seeded random 3-d shape"""
    rng = _rng(ctx, 0)
    shape = (rng.randint(2, 5), rng.randint(2, 5), rng.randint(2, 5))
    a, b, c = shape
    chains = [
        [("transpose", 0, -1)],
        [("permute", (2, 0, 1))],
        [("slice", 1, 1, None, 2)],
        [("select", 0, -1)],
        [("unsqueeze", 1)],
        [("unsqueeze", -1)],
        [("slice", 2, 0, 1, 1), ("expand", (2, a, b, 4))],
        [("as_strided", (b, 2), (1, c), rng.randint(0, c - 1))],
        [("transpose", 0, 1), ("contiguous",)],
        [("contiguous",)],
    ]
    for ops in chains:
        compare(view_geometry, shape, ops, f"the chain {ops}")


@check(EXERCISE)
def short_chains(view_geometry, ctx):
    """chains of two to four views on seeded random shapes"""
    rng = _rng(ctx, 1)
    for i in range(12):
        shape = random_shape(rng)
        ops = random_chain(rng, shape, rng.randint(2, 4))
        compare(view_geometry, shape, ops, f"random chain #{i}")


@check(EXERCISE)
def beyond_int64(view_geometry, ctx):
    """two chains on a shape with sizes above 2**64, which no tensor can have"""
    rng = _rng(ctx, 4)
    for i in range(2):
        shape, ops, want = huge_case(rng, 3)
        compare(view_geometry, shape, ops, f"the chain {ops}", want)


@check(EXERCISE, hidden=True)
def long_random_chains(view_geometry, ctx):
    """long random chains: negative dims, steps, expanded dims, as_strided, copies"""
    rng = _rng(ctx, 2)
    for i in range(60):
        shape = random_shape(rng, zeros=i % 4 == 0)
        ops = random_chain(rng, shape, rng.randint(4, 9))
        compare(view_geometry, shape, ops, f"random chain #{i} (seed {ctx.seed})")


@check(EXERCISE, hidden=True)
def edge_cases(view_geometry, ctx):
    """empty slices, size-1 and size-0 dims, stride-0 dims, contiguity of odd strides"""
    rng = _rng(ctx, 3)
    n = rng.randint(3, 5)
    cases = [
        ((n, 4), [("slice", 0, n + 2, None, 1)]),                 # start past the end: empty
        ((n, 4), [("slice", 1, -1, 1, 1)]),                       # stop before start
        ((n, 4), [("slice", 1, -10, 3, 2), ("slice", 0, -2, None, 3)]),
        ((n,), [("expand", (1, n))]),                            # new leading dim of size 1
        ((n,), [("expand", (2, 1, n))]),
        ((1, n), [("expand", (3, -1)), ("contiguous",)]),         # stride 0: contiguous copies
        ((n, 1), [("transpose", 0, 1), ("contiguous",)]),         # size-1 strides don't count
        ((2, 1, n), [("as_strided", (2, 1, n), (n, 100, 1), 0), ("contiguous",)]),
        ((0, n), [("transpose", 0, 1), ("contiguous",)]),         # no elements: contiguous
        ((n, 3), [("transpose", 0, 1), ("unsqueeze", 2), ("unsqueeze", 1)]),
        ((n, 3), [("select", 1, 2), ("unsqueeze", 0), ("expand", (4, n)), ("select", 0, -1)]),
        ((n, 3), [("transpose", -1, -2), ("contiguous",), ("slice", 0, 1, None, 1),
                  ("as_strided", (2,), (1,), None)]),
        ((n, 4), [("slice", 1, 1, None, 2), ("permute", (-1, 0)), ("select", 0, 1)]),
    ]
    for shape, ops in cases:
        compare(view_geometry, shape, ops, f"the chain {ops}")


@check(EXERCISE, hidden=True)
def long_chains_beyond_int64(view_geometry, ctx):
    """random chains on shapes with sizes above 2**64: geometry torch cannot be asked for"""
    rng = _rng(ctx, 5)
    for i in range(12):
        shape, ops, want = huge_case(rng, rng.randint(4, 8))
        compare(view_geometry, shape, ops, f"random chain #{i} beyond int64 (seed {ctx.seed})", want)
