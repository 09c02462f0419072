"""The autograd lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). Each builds the inputs an answer needs from plain parameters (an autograd
graph from a seed, a model, a batch), calls the answer, and returns what it observed as plain data;
the judges in ``labs/autograd/checks`` build the same inputs in the grader's process with the same
builders (defined here, public), compute torch's answer and decide. Nothing here knows a right
answer.

What an answer returns is reduced by :func:`shown`: plain values stay as they are; every dict
becomes ``{"?": "dict", "type": ..., "items": [[key, value], ...]}`` (its keys need not be str);
objects that are graph parts (a Node, a leaf tensor) become references the judge can resolve in its
own copy of the graph; anything else becomes ``{"?": "object", "type": ..., "base": ...}`` (its
type's name and the builtin type it derives from), so that a subclass that could lie about its
contents is refused for its type.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools

from grader.checks import probe
from grader.checks import raised

#: the builtin types an object's marker names as its base (the first that it is an instance of)
_BASES = ("bool", "int", "float", "complex", "str", "bytes", "list", "tuple", "dict")
#: the dict types whose contents :func:`shown` lists (exactly these types)
_DICTS = (dict, collections.OrderedDict, collections.defaultdict)
_SCALARS = (type(None), bool, int, float, complex, str, bytes)


# --------------------------------------------------------------------------- reducing answers
def shown(value, ref=None):
    """``value`` as plain data (see the module's docstring). ``ref(obj)`` is asked first for every
    object that is not a plain scalar or container: it returns a plain stand-in (a marker dict
    with a ``"?"`` key) or None for the default (a plain tensor as itself, else an object
    marker). Returns plain data only; never raises for what the answer returned."""
    import torch

    t = type(value)
    if t in _SCALARS:
        return value
    if t in (list, tuple):
        return t(shown(v, ref) for v in value)
    if t in _DICTS:
        return {"?": "dict", "type": t.__name__,
                "items": [[shown(k, ref), shown(v, ref)] for k, v in dict.items(value)]}
    if ref is not None and (r := ref(value)) is not None:
        return r
    if t in (torch.Tensor, torch.nn.Parameter):
        return value
    return marker(value)


def marker(value) -> dict:
    """``{"?": "object", "type": its name, "base": the builtin type it derives from (or
    "Tensor"), or None}`` for an object that is not plain data."""
    import builtins

    import torch

    base = next((b for b in _BASES if isinstance(value, getattr(builtins, b))), None)
    if base is None and isinstance(value, torch.Tensor):
        base = "Tensor"
    return {"?": "object", "type": type(value).__name__, "base": base}


def is_node(obj) -> bool:
    """Whether ``obj`` is an autograd Node (a C++ node or a custom Function's BackwardCFunction,
    torch/autograd/graph.py: Node)."""
    import torch

    try:
        return isinstance(obj, torch.autograd.graph.Node)
    except Exception:
        return False


def next_sequence_nr() -> int:
    """The ``_sequence_nr()`` the next Node made on this thread will carry (one Node is made to
    read it: aten/src/ATen/SequenceNumber.h, a thread_local counter)."""
    import torch

    leaf = torch.zeros((), requires_grad=True)
    return (leaf * 1).grad_fn._sequence_nr() + 1


def graph_ref(leaves: list):
    """A ``ref`` for :func:`shown` that names graph parts: a Node as ``{"?": "node", "type":
    name, "seq": _sequence_nr(), "leaf": index in ``leaves`` of its variable (AccumulateGrad), or
    -1}``; a tensor of ``leaves`` as ``{"?": "leaf", "index": i}``; another plain tensor as
    ``{"?": "tensor", "value": detached, "requires_grad": bool}``."""
    import torch

    index = {id(t): i for i, t in enumerate(leaves)}

    def ref(obj):
        if is_node(obj):
            try:
                seq = int(obj._sequence_nr())
            except Exception:
                seq = -1
            leaf = -1
            if type(obj).__name__ == "AccumulateGrad":
                leaf = index.get(id(getattr(obj, "variable", None)), -1)
            return {"?": "node", "type": type(obj).__name__, "seq": seq, "leaf": leaf}
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            if id(obj) in index and obj is leaves[index[id(obj)]]:
                return {"?": "leaf", "index": index[id(obj)]}
            return {"?": "tensor", "value": obj.detach(), "requires_grad": obj.requires_grad}
        return None

    return ref


# --------------------------------------------------------------------------- graphs
def ri(g, lo: int, hi: int) -> int:
    """A seeded integer in [lo, hi] drawn from generator ``g``."""
    import torch

    return int(torch.randint(lo, hi + 1, (1,), generator=g))


def generator(seed: int, offset: int):
    """A CPU ``torch.Generator`` seeded with ``seed + offset`` (as ``CheckContext.generator``)."""
    import torch

    return torch.Generator().manual_seed(seed + offset)


def _twice_function():
    """A tiny custom autograd.Function (its node is a Python ``...Backward`` node)."""
    import torch

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2

    return Twice


def random_graph(g, n_ops: int = 20, *, custom_function: bool = False, worker=None):
    """A seeded random DAG of float64 vector ops with fan-out, reuse, constants and splits.

    Returns ``(leaves, output)``: the leaves that require grad (some may end up unused) and a
    non-leaf output (a vector, summed to a scalar half of the time). ``custom_function`` mixes in
    a custom ``autograd.Function`` node (not callable as ``node(*grads)``: walk-only graphs).
    ``worker``: a :class:`Worker`; then the calling thread and the worker's thread take turns
    building the ops, so nodes the worker makes late carry lower sequence numbers than the
    calling thread's nodes they point to.
    """
    import torch

    n = ri(g, 1, 5)
    leaves = [torch.randn(n, generator=g, dtype=torch.float64).requires_grad_()
              for _ in range(ri(g, 2, 4))]
    consts = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]
    pool = list(leaves) + consts
    twice = _twice_function() if custom_function else None

    def pick():
        if ri(g, 0, 2) == 0:                      # anything made so far: fan-out and reuse
            return pool[ri(g, 0, len(pool) - 1)]
        return pool[max(0, len(pool) - 1 - ri(g, 0, 3))]   # something recent: depth

    def make(kind, a, b):
        """The tensors op ``kind`` makes from ``a`` and ``b``."""
        if kind == 0:
            new = [torch.mul(a, b)]
        elif kind == 1:
            new = [torch.add(a, b)]
        elif kind == 2:
            new = [torch.tanh(a)]
        elif kind == 3:
            new = [torch.mul(torch.sin(a), a)]
        elif kind == 4:
            new = [torch.mul(a, a)]                 # the same tensor twice: two equal edges
        elif kind == 5:
            new = [torch.sub(a, b)]
        elif kind == 6:
            new = [torch.mul(a, consts[ri(g, 0, 1)])]   # an input without grad: a None edge
        elif kind == 7:                                 # a multi-output node, outputs used or not
            parts = torch.split(torch.cat([a, b]), n)
            new = [p for p, keep in zip(parts, (ri(g, 0, 1), 1)) if keep]
        elif kind == 8:
            new = [torch.sum(torch.stack([a, b, a]), 0)]
        elif kind == 9 and twice is not None:
            new = [twice.apply(a)]
        else:
            new = [torch.mul(torch.sigmoid(a), b)]
        return new

    in_worker = False
    for _ in range(n_ops):
        kind, a, b = ri(g, 0, 10), pick(), pick()
        if worker is not None and ri(g, 0, 2) == 0:   # runs of ops on either thread
            in_worker = not in_worker
        new = worker.run(make, kind, a, b) if in_worker else make(kind, a, b)
        pool.extend(t for t in new if t.requires_grad)
    made = [t for t in pool if t.grad_fn is not None]
    if not made:
        made = [torch.mul(leaves[0], leaves[-1])]
    picked = made[-ri(g, 1, min(4, len(made))):]
    if ri(g, 0, 2) == 0 and len(made) > len(picked):
        picked.append(made[ri(g, 0, len(made) - 1)])
    out = functools.reduce(torch.add, picked)
    if ri(g, 0, 1):
        out = torch.sum(out)
    return leaves, out


class Worker:
    """A second thread that builds parts of a graph; use as ``with Worker() as w: w.run(fn,
    *args)``.

    Sequence numbers are per thread (``aten/src/ATen/SequenceNumber.h``: a ``thread_local``
    counter, which ``torch/csrc/autograd/node.h: Node::Node`` reads), and the worker's counts from
    0. Entering moves the calling thread's counter to at least ``reserve`` (more numbers than the
    worker will use), so that no two nodes of the graph share a number: among equal numbers the
    ready queue's order is its heap's, which no answer could replay. ``context``: a callable
    returning a context manager to enter around each job in the worker (saved-tensor hooks and
    grad mode are thread-local too).
    """

    def __init__(self, reserve: int = 1000, context=None):
        self.reserve, self.context = reserve, context or contextlib.nullcontext

    def __enter__(self):
        import torch

        leaf = torch.zeros((), requires_grad=True)
        while (leaf * 1).grad_fn._sequence_nr() < self.reserve:   # one node per turn
            pass
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)   # one thread
        return self

    def __exit__(self, *exc):
        self._pool.shutdown(wait=True)

    def run(self, fn, *args):
        """``fn(*args)``, run on the worker thread."""
        def job():
            with self.context():
                return fn(*args)
        return self._pool.submit(job).result()


def crossed_graph(g, worker):
    """The smallest graph where descending ``_sequence_nr()`` is no schedule: ``h = x.sin()``
    here, ``k = (h * w).exp()`` on ``worker`` (numbered from 0, below ``h``'s node), then
    ``(k + h).sum()`` here. Returns ``([x, w], output)``; float64 leaves of a seeded shape."""
    import torch

    n = ri(g, 1, 5)
    x, w = (torch.randn(n, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    h = torch.sin(x)
    k = worker.run(lambda: torch.exp(torch.mul(h, w)))
    return [x, w], torch.sum(torch.add(k, h))


def mlp(g):
    """A two-layer perceptron with hand-made parameters: ``(params, loss)``, a 0-d float32
    loss of ``((tanh(x @ w1.T + b1) @ w2.T + b2) ** 2).mean()``."""
    import torch

    x = torch.randn(5, 3, generator=g)
    w1 = (torch.randn(4, 3, generator=g) * 0.5).requires_grad_()
    b1 = torch.randn(4, generator=g).requires_grad_()
    w2 = (torch.randn(2, 4, generator=g) * 0.5).requires_grad_()
    b2 = torch.randn(2, generator=g).requires_grad_()
    hidden = torch.tanh(x @ w1.T + b1)
    loss = ((hidden @ w2.T + b2) ** 2).mean()
    return [w1, b1, w2, b2], loss


# --------------------------------------------------------------------------- graph-walk
def walk_cases(name: str, seed: int):
    """The graphs check ``name`` of ``autograd.graph-walk`` walks, built lazily in order (they
    share a generator): yields ``(where, leaves, output, base)`` where ``base`` is the
    ``_sequence_nr()`` of the first node built on the calling thread (a worker's nodes carry
    lower numbers)."""
    import torch

    if name == "small_mlp":
        base = next_sequence_nr()
        leaves, loss = mlp(generator(seed, 0))
        yield ("the MLP loss ((tanh(x @ w1.T + b1) @ w2.T + b2) ** 2).mean()", leaves, loss,
               base)
    elif name == "shared_subexpression":
        g = generator(seed, 1)
        x = torch.randn(3, generator=g).requires_grad_()
        w = torch.randn(3, generator=g).requires_grad_()
        c = torch.randn(3, generator=g)
        base = next_sequence_nr()
        h = x * w
        out = (h.sin() + h * c + x * x).sum()
        yield ("(h.sin() + h * c + x * x).sum() with h = x * w and c constant", [x, w], out,
               base)
    elif name == "random_graphs":
        g = generator(seed, 2)
        for i in range(6):
            n_ops = ri(g, 3, 30)
            base = next_sequence_nr()
            leaves, out = random_graph(g, n_ops, custom_function=bool(i % 2))
            yield f"random graph #{i} ({n_ops} ops, seed {seed})", leaves, out, base
    elif name == "graphs_built_by_two_threads":
        g = generator(seed, 5)
        with Worker() as worker:
            base = next_sequence_nr()
            leaves, out = crossed_graph(g, worker)
        yield ("h = x.sin() built on one thread, k = (h * w).exp() on a second, then "
               "(k + h).sum() on the first", leaves, out, base)
        for i in range(3):
            n_ops = ri(g, 8, 30)
            with Worker() as worker:
                base = next_sequence_nr()
                leaves, out = random_graph(g, n_ops, custom_function=bool(i % 2),
                                           worker=worker)
            yield (f"random graph #{i} built by two threads ({n_ops} ops, seed {seed})", leaves,
                   out, base)
    elif name == "edge_cases":
        g = generator(seed, 3)
        s = torch.randn((), generator=g).requires_grad_()
        m = torch.randn(2, 3, generator=g).requires_grad_()
        k = torch.randn(3, 2, generator=g)
        base = next_sequence_nr()
        y = (m * s) @ k @ (m * s)             # the same leaves reached along four paths
        parts = torch.cat([y.flatten(), m.flatten()]).split(3)
        root = parts[ri(g, 0, len(parts) - 1)] * s * s
        yield "a graph built from a 0-d leaf s, a 2x3 leaf m and a split", [s, m], root, base
        lone = torch.randn(4, generator=g).requires_grad_()
        base = next_sequence_nr()
        yield "lone.exp() for a leaf `lone` (two nodes, one edge)", [lone], lone.exp(), base
    elif name == "deep_chain":
        g = generator(seed, 4)
        x = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
        base = next_sequence_nr()
        y = x
        for i in range(4000 + ri(g, 0, 500)):
            y = y * 0.999 if i % 2 else y + x
        yield "a chain of about 4000 ops", [x], y, base
    else:
        raise ValueError(f"no graph-walk check {name!r}")


@probe
def walks(walk_graph, name: str, seed: int) -> list:
    """``walk_graph(output)`` on each graph of :func:`walk_cases` ``(name, seed)``, in order, up
    to the first that raises. Returns one entry per graph walked: ``{"base": the case's base
    sequence number, "got": shown(what it returned)}`` (Nodes and leaves named by
    :func:`graph_ref`), the last one ``{"raised": record}`` when the answer raised there."""
    out = []
    for _, leaves, output, base in walk_cases(name, seed):
        try:
            got = walk_graph(output)
        except Exception as exc:
            out.append({"raised": raised(exc)})
            break
        out.append({"base": base, "got": shown(got, graph_ref(leaves))})
    return out


# --------------------------------------------------------------------------- engine
class Recorder:
    """Saved-tensor hooks that log each unpack, attributed to the node torch's engine is running
    (``torch/autograd/graph.py: saved_tensors_hooks``): every call of a node unpacks what it
    saved, so the sequence of unpacks is the sequence of node calls. Tokens count the packs in
    the order the forward made them, the same wherever the same graph is built."""

    def __init__(self):
        self.log: list[int] = []
        self.owner: dict[int, object] = {}
        self.current = None
        self._tokens = 0

    def pack(self, tensor):
        """Pack a saved tensor with a fresh token."""
        self._tokens += 1
        return (self._tokens, tensor)

    def unpack(self, packed):
        """Log the token (and the node torch is running, if any)."""
        token, tensor = packed
        self.log.append(token)
        if self.current is not None:
            self.owner[token] = self.current
        return tensor

    def hooks(self):
        """The saved_tensors_hooks context manager for this recorder."""
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def entering(self, node):
        """A pre-hook that marks ``node`` as the one torch's engine is running."""
        def prehook(grad_outputs):
            self.current = node
        return prehook


class GraphBuilder:
    """A graph builder with the seeded generator it draws from (grad_output is drawn from it
    too). With ``two_threads``, ``fn(g, worker)`` gets a :class:`Worker` whose jobs run under
    the recorder's hooks (saved-tensor hooks are thread-local)."""

    def __init__(self, g, fn, two_threads: bool = False):
        self.g, self.fn, self.two_threads = g, fn, two_threads

    def build(self):
        """Build the graph under a fresh :class:`Recorder`: ``(recorder, leaves, output)``."""
        rec = Recorder()
        with rec.hooks():
            if not self.two_threads:
                leaves, out = self.fn(self.g)
            else:
                with Worker(context=rec.hooks) as worker:
                    leaves, out = self.fn(self.g, worker)
        return rec, leaves, out

    def grad_output(self, out, default: bool):
        """The gradient of ``out`` the engine starts from: ``ones_like`` when ``default``, else
        drawn from the builder's generator (float ``out.dtype``, ``out.shape``)."""
        import torch

        if default:
            return torch.ones_like(out)
        return torch.randn(out.shape, generator=self.g, dtype=out.dtype)


def _fan_out(g):
    """x (3,) and w (2, 3): h = x * w used twice, x used three times, a constant c."""
    import torch

    x = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(2, 3, generator=g, dtype=torch.float64).requires_grad_()
    c = torch.randn(2, 3, generator=g, dtype=torch.float64)
    h = x * w                                     # x is broadcast to (2, 3)
    return [x, w], (h.sin() + h * c + x * x).sum()


def _diamonds(g):
    """Five diamonds in a row: an engine without dependency counting runs nodes many times."""
    import torch

    x = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(4, generator=g, dtype=torch.float64).requires_grad_()
    h = x * w
    for _ in range(5):
        h = torch.tanh(h) * h                     # h feeds two nodes: a diamond per layer
    return [x, w], h


def _two_branches(g):
    """Two branches built interleaved: FIFO or LIFO queues run them in another order than
    torch."""
    import torch

    x = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    w = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    a = x.sin()
    b = w.tanh()
    a2 = a * x
    b2 = b * w
    return [x, w], (a2 * b2.exp() + b2.sigmoid()).sum()


def _split_root(g):
    """The root is output k of UnbindBackward0 (4 slots); a 0-d leaf and a constant matrix."""
    import torch

    s = torch.randn((), generator=g, dtype=torch.float64).requires_grad_()
    m = torch.randn(2, 3, generator=g, dtype=torch.float64).requires_grad_()
    k = torch.randn(3, 2, generator=g, dtype=torch.float64)          # no grad: None edges
    y = (m * s) @ k @ (m * s)
    rows = torch.cat([y, m * s]).unbind(0)                            # a node with 4 outputs
    return [s, m], rows[1 + ri(g, 0, 2)]                              # the root: output k of it


def _leaf_twice(g):
    """x * x (two equal edges to one AccumulateGrad) and a leaf the output does not use."""
    import torch

    x = torch.randn(ri(g, 1, 4), generator=g, dtype=torch.float64).requires_grad_()
    unused = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    return [x, unused], x * x


def _mixed_dtypes(g):
    """A float32 and a float64 leaf, broadcast together: gradients must be summed and cast
    back."""
    import torch

    x = torch.randn(3, 1, generator=g).requires_grad_()                       # float32
    y = torch.randn(1, 4, generator=g, dtype=torch.float64).requires_grad_()  # float64
    z = x * y                                      # promoted to float64, broadcast to (3, 4)
    return [x, y], (z.tanh() * x).sum()


def _chain(g):
    """A chain of 3000 ops (sin, add of x, scale): too deep for a recursive engine."""
    import torch

    x = torch.randn(2, generator=g, dtype=torch.float64).requires_grad_()
    y = x
    for i in range(3000):
        y = y * 0.999 if i % 2 else torch.sin(y) + x
    return [x], y.sum()


def engine_cases(name: str, seed: int):
    """The graphs check ``name`` of ``autograd.engine`` runs, in order (they may share a
    generator, so build each, and draw its grad_output, before asking for the next): yields
    ``(where, builder, options)``, ``builder`` a :class:`GraphBuilder`, ``options`` a dict of
    ``grad_output`` (``"random"`` or ``"default"``: the answer is called without one), and
    ``counts`` / ``order`` (whether node calls are counted / ordered)."""
    full = {"grad_output": "random", "counts": True, "order": True}
    if name == "fan_out":
        yield ("(h.sin() + h * c + x * x).sum() with x of shape (3,), h = x * w of shape (2, 3), "
               "c constant (called without grad_output)",
               GraphBuilder(generator(seed, 10), _fan_out),
               {"grad_output": "default", "counts": False, "order": False})
    elif name == "each_node_once":
        yield ("five layers of h = tanh(h) * h (a vector output)",
               GraphBuilder(generator(seed, 11), _diamonds), {**full, "order": False})
    elif name == "ready_queue_order":
        yield ("two interleaved branches a = x.sin(), b = w.tanh(), a2 = a * x, b2 = b * w, "
               "then (a2 * b2.exp() + b2.sigmoid()).sum()",
               GraphBuilder(generator(seed, 12), _two_branches), full)
    elif name == "random_graphs":
        g = generator(seed, 13)
        for i in range(8):
            n_ops = ri(g, 3, 30)
            yield (f"random graph #{i} ({n_ops} ops, seed {seed})",
                   GraphBuilder(g, lambda gen, n=n_ops: random_graph(gen, n)), full)
    elif name == "graphs_built_by_two_threads":
        g = generator(seed, 16)
        yield ("h = x.sin() built on one thread, k = (h * w).exp() on a second, then "
               "(k + h).sum() on the first", GraphBuilder(g, crossed_graph, True), full)
        for i in range(3):
            n_ops = ri(g, 8, 30)
            yield (f"random graph #{i} built by two threads ({n_ops} ops, seed {seed})",
                   GraphBuilder(g, lambda gen, worker, n=n_ops: random_graph(gen, n,
                                                                             worker=worker),
                                True), full)
    elif name == "edge_cases":
        g = generator(seed, 14)
        yield ("a root taken from torch.cat(...).unbind(0), with a 0-d leaf and a constant "
               "matrix", GraphBuilder(g, _split_root), full)
        yield "x * x, with another leaf left unused", GraphBuilder(g, _leaf_twice), full
        yield ("a float32 leaf of shape (3, 1) times a float64 leaf of shape (1, 4)",
               GraphBuilder(g, _mixed_dtypes), full)
    elif name == "deep_chain":
        yield ("a chain of 3000 ops", GraphBuilder(generator(seed, 15), _chain),
               {"grad_output": "random", "counts": False, "order": False})
    else:
        raise ValueError(f"no engine check {name!r}")


@probe
def backward_runs(run_backward, name: str, seed: int) -> list:
    """``run_backward(output, grad_output)`` (or ``run_backward(output)``) on each graph of
    :func:`engine_cases` ``(name, seed)``, in order, up to the first call that raises. Returns
    one entry per graph: ``{"result": shown(what it returned)`` (leaves named by index, other
    tensors with their value and ``requires_grad``: :func:`graph_ref`), ``"tokens"``: the
    saved-tensor unpacks of its run, in order (:class:`Recorder`), ``"used_engine"``: whether
    torch's engine ran the root node, ``"leaf_grad"``: whether a leaf got a ``.grad``,
    ``"grad_output_modified"``: whether grad_output changed in place``}``; the last one
    ``{"raised": record}`` when the answer raised there."""
    import torch

    out = []
    for _, builder, options in engine_cases(name, seed):
        rec, leaves, output = builder.build()
        default = options["grad_output"] == "default"
        go = builder.grad_output(output, default)
        go_before = go.clone()
        used_engine = []
        handle = output.grad_fn.register_prehook(lambda grads: used_engine.append(True))
        try:
            result = run_backward(output) if default else run_backward(output, go)
        except Exception as exc:
            out.append({"raised": raised(exc)})
            break
        finally:
            handle.remove()
        out.append({"result": shown(result, graph_ref(leaves)), "tokens": list(rec.log),
                    "used_engine": bool(used_engine),
                    "leaf_grad": any(leaf.grad is not None for leaf in leaves),
                    "grad_output_modified": not torch.equal(go, go_before)})
    return out


# --------------------------------------------------------------------------- custom-function
def _applier(function, observed: list):
    """``f(x, beta)``: ``function.apply(x, beta)``, noting in ``observed`` what each call gave
    (each different observation once): ``{"type", "base"`` (of the output, as :func:`marker`
    names them), ``"shape", "dtype", "grad_fn"`` (its type's name, or None), ``"own_node"``
    (whether ``grad_fn`` is the node ``apply`` recorded for ``function``:
    torch/autograd/function.py, BackwardCFunction), ``"input_shape", "input_dtype",
    "recording"`` (whether the input required grad with grad mode on)``}``."""
    import torch
    from torch.autograd.function import BackwardCFunction

    def f(x, beta):
        out = function.apply(x, beta)
        seen = {**marker(out), "shape": None, "dtype": None, "grad_fn": None, "own_node": False,
                "input_shape": list(x.shape), "input_dtype": x.dtype,
                "recording": bool(x.requires_grad and torch.is_grad_enabled())}
        if type(out) is torch.Tensor:
            node = out.grad_fn
            seen.update(shape=list(out.shape), dtype=out.dtype,
                        grad_fn=None if node is None else type(node).__name__,
                        own_node=isinstance(node, BackwardCFunction)
                        and getattr(node, "_forward_cls", None) is function)
        if seen not in observed:
            observed.append(seen)
        return out

    return f


def _numerical(fn, inputs: list, eps: float) -> list:
    """``fn`` evaluated at each input element moved by +eps and by -eps (torch's gradcheck's
    numerical Jacobian, torch/autograd/gradcheck.py: _compute_numerical_gradient): for each
    input, ``[plus, minus]``, each of shape ``(input.numel(), *output.shape)`` (a
    :func:`marker` when an output was no plain tensor)."""
    import torch

    out = []
    for k, x in enumerate(inputs):
        sides = []
        for sign in (1, -1):
            rows = []
            for i in range(x.numel()):
                moved = [t.detach().clone() for t in inputs]
                moved[k].view(-1)[i] += sign * eps
                rows.append(_plain_or_marker(fn(*[t.requires_grad_() for t in moved])))
            bad = next((r for r in rows if type(r) is dict), None)
            sides.append(bad or (torch.stack(rows) if rows else torch.zeros(0)))
        out.append(sides)
    return out


def _analytical(output, inputs: list) -> list:
    """The Jacobian of ``output`` with respect to each of ``inputs`` by one vector-Jacobian
    product per output element (gradcheck's analytical Jacobian): for each input, a tensor of
    shape ``(output.numel(), input.numel())`` (zeros where the output does not depend on it or
    does not require grad; a :func:`marker` when the backward gave a tensor subclass)."""
    import torch

    rows = [[] for _ in inputs]
    flat = output.reshape(-1)
    for j in range(flat.numel()):
        if output.requires_grad:
            grads = torch.autograd.grad(flat[j], inputs, retain_graph=True, allow_unused=True)
        else:
            grads = [None] * len(inputs)
        for k, (x, g) in enumerate(zip(inputs, grads)):
            g = torch.zeros(x.numel(), dtype=x.dtype) if g is None else _plain_or_marker(g)
            rows[k].append(g if type(g) is dict else g.reshape(-1))
    out = []
    for r, x in zip(rows, inputs):
        bad = next((g for g in r if type(g) is dict), None)
        out.append(bad or (torch.stack(r) if r else torch.zeros(0, x.numel(), dtype=x.dtype)))
    return out


def _plain_or_marker(t):
    """``t`` detached when it is a plain tensor, else its :func:`marker`."""
    import torch

    return t.detach() if type(t) in (torch.Tensor, torch.nn.Parameter) else marker(t)


def _softplus_request(f, request: list) -> dict:
    """One request of :func:`softplus_runs` (its docstring says which), as far as it gets."""
    import torch

    kind, x, beta = request[0], request[1], request[2]
    got: dict = {}
    try:
        if kind == "value":
            got["out"] = shown(f(x, beta))
        elif kind == "derivatives":
            v, u = request[3], request[4]
            t = x.detach().clone().requires_grad_()
            (grad,) = torch.autograd.grad(f(t, beta), t, v, create_graph=True)
            got["grad"] = shown(grad)
            got["grad_requires_grad"] = bool(grad.requires_grad)
            if grad.requires_grad:
                (hvp,) = torch.autograd.grad(grad, t, u, allow_unused=True)
                got["hvp"] = shown(hvp)
        elif kind == "jacobians":
            eps, go = request[3], request[4]
            if go is None:                         # f itself
                def fn(t):
                    return f(t, beta)
                inputs = [x.detach().clone().requires_grad_()]
            else:                                  # its backward, as gradgradcheck takes it
                def fn(t, g):
                    return torch.autograd.grad(f(t, beta), t, g, create_graph=True)[0]
                inputs = [x.detach().clone().requires_grad_(),
                          go.detach().clone().requires_grad_()]
            output = fn(*inputs)
            got["output_requires_grad"] = bool(output.requires_grad)
            got["analytical"] = _analytical(output, inputs)
            got["numerical"] = _numerical(fn, inputs, eps)
        elif kind == "saves":
            packed = []
            with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(1) or t,
                                                          lambda t: t):
                out = f(x.detach().clone().requires_grad_(), beta)
            got["packed"] = len(packed)
            out.sum().backward()
    except Exception as exc:
        got["raised"] = raised(exc)
        got["runtime_error"] = isinstance(exc, RuntimeError)
    return got


@probe
def softplus_runs(Softplus, requests: list) -> dict:
    """Run ``Softplus.apply`` as each request asks, in order. Returns ``{"function": whether
    Softplus is a class deriving from torch.autograd.Function, "type": its type's name,
    "results": [one dict per request]}``; each result has ``"applied"`` (what each call of
    ``apply`` gave: :func:`_applier`) and, as far as the request got before the answer raised
    (then ``"raised"``: a record, and ``"runtime_error"``: whether it is a RuntimeError):

    - ``["value", x, beta]``: ``"out"``: ``apply(x, beta)`` (:func:`shown`);
    - ``["derivatives", x, beta, v, u]``: ``"grad"``: the vector-Jacobian product with ``v``
      taken with ``create_graph=True``, ``"grad_requires_grad"``, and ``"hvp"``: the gradient
      of that with ``u`` (None when it does not depend on x);
    - ``["jacobians", x, beta, eps, go]``: for ``f = apply(., beta)`` (``go`` None) or for its
      backward ``(x, go) -> vjp(f, x, go)`` with ``create_graph`` (gradgradcheck's function):
      ``"analytical"`` (:func:`_analytical`), ``"numerical"`` (:func:`_numerical`) and
      ``"output_requires_grad"``;
    - ``["saves", x, beta]``: ``"packed"``: how many tensors ``apply`` saved through
      saved-tensor hooks, then a backward of the output's sum.
    """
    import torch

    is_function = isinstance(Softplus, type) and issubclass(Softplus, torch.autograd.Function)
    results = []
    if is_function:
        for request in requests:
            observed: list = []
            got = _softplus_request(_applier(Softplus, observed), request)
            results.append({"applied": observed, **got})
    return {"function": is_function, "type": type(Softplus).__name__, "results": results}


# --------------------------------------------------------------------------- per-sample-grads
def _init(model, gen, dtype, device):
    """``model`` with every parameter drawn from ``gen`` (scaled by 1/sqrt(fan-in)), moved to
    ``dtype`` and ``device``."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen)
                    / max(1, p.shape[-1] if p.dim() else 1) ** 0.5)
    return model.to(device=device, dtype=dtype)


def _quietly(make):
    """Build a module without drawing from the global RNG (its default init would)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        return make()


def per_sample_mlp(gen, dims, dtype, device):
    """An ``nn.Sequential`` of Linear layers of widths ``dims`` with Tanh between them, its
    parameters drawn from ``gen``."""
    from torch import nn

    layers = []
    for i in range(len(dims) - 1):
        layers += [_quietly(lambda i=i: nn.Linear(dims[i], dims[i + 1])), nn.Tanh()]
    return _init(nn.Sequential(*layers[:-1]), gen, dtype, device)


def _conv_net(c_in, c_mid, classes, length):
    """A small conv model (``Conv1d`` then ``Linear``) with a frozen parameter ``temperature``
    and a buffer ``shift``."""
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(c_in, c_mid, 3, padding=1)
            self.head = nn.Linear(c_mid * length, classes)
            self.temperature = nn.Parameter(torch.ones(()), requires_grad=False)   # frozen
            self.register_buffer("shift", torch.zeros(c_in, 1))

        def forward(self, x):
            h = torch.relu(self.conv(x - self.shift))
            return self.head(h.flatten(1)) / self.temperature

    return ConvNet()


def per_sample_cases(name: str, seed: int, device: str = "cpu"):
    """The cases check ``name`` of ``autograd.per-sample-grads`` runs, built lazily in order
    (they share a generator): yields ``(label, model, loss_fn, inputs, targets, tolerances)``,
    ``tolerances`` a dict of ``rtol`` and ``atol``."""
    import torch
    import torch.nn.functional as F

    loose = {"rtol": 1e-4, "atol": 1e-6}
    if name == "matches_per_example_loop":
        gen = generator(seed, 20)
        model = per_sample_mlp(gen, [5, 8, 3], torch.float32, device)
        x = torch.randn(6, 5, generator=gen).to(device)
        y = torch.randn(6, 3, generator=gen).to(device)
        yield "MLP 5->8->3, batch 6, mse_loss", model, F.mse_loss, x, y, loose
    elif name == "one_vectorized_call_model_untouched":
        gen = generator(seed, 21)
        model = per_sample_mlp(gen, [4, 6, 2], torch.float32, device)
        x = torch.randn(5, 4, generator=gen).to(device)
        y = torch.randn(5, 2, generator=gen).to(device)
        yield "MLP 4->6->2, batch 5, mse_loss", model, F.mse_loss, x, y, loose
    elif name == "random_mlps_cross_entropy":
        gen = generator(seed, 22)
        for batch in (1, 7, int(torch.randint(2, 12, (1,), generator=gen)) * 2 + 1):
            depth = int(torch.randint(1, 4, (1,), generator=gen))
            dims = [int(d) for d in torch.randint(2, 9, (depth + 1,), generator=gen)]
            model = per_sample_mlp(gen, dims, torch.float32, device)
            x = torch.randn(batch, dims[0], generator=gen).to(device)
            y = torch.randint(0, dims[-1], (batch,), generator=gen).to(device)
            yield (f"MLP {dims}, batch {batch}, cross_entropy", model, F.cross_entropy, x, y,
                   loose)
    elif name == "frozen_parameter_buffer_conv":
        gen = generator(seed, 23)
        c_in, c_mid, classes, length = (int(v) for v in torch.randint(2, 5, (4,), generator=gen))
        batch = int(torch.randint(1, 5, (1,), generator=gen)) * 2 + 1
        model = _init(_quietly(lambda: _conv_net(c_in, c_mid, classes, length)), gen,
                      torch.float64, device)
        with torch.no_grad():
            model.temperature.fill_(1.5)
            model.shift.copy_(torch.randn(c_in, 1, generator=gen))
        x = torch.randn(batch, c_in, length, generator=gen, dtype=torch.float64).to(device)
        y = torch.randint(0, classes, (batch,), generator=gen).to(device)
        yield (f"Conv1d({c_in}->{c_mid}) + Linear, float64, batch {batch}, a frozen parameter "
               "and a buffer", model, F.cross_entropy, x, y, {"rtol": 1e-7, "atol": 1e-9})
    else:
        raise ValueError(f"no per-sample-grads check {name!r}")


@probe
def per_sample_runs(per_sample_grads, name: str, seed: int, device: str = "cpu") -> list:
    """``per_sample_grads(model, loss_fn, inputs, targets)`` on each case of
    :func:`per_sample_cases` ``(name, seed, device)``, in order, up to the first that raises.
    In check ``one_vectorized_call_model_untouched`` the first parameter gets a ``.grad`` of
    sevens before the call (one left over from training). Returns one entry per case:
    ``{"got": shown(what it returned), "runs": how many
    times the model's forward ran, "replaced": whether named_parameters() no longer gives the
    same Parameter objects, "changed": [names of parameters whose values changed],
    "grads_changed": whether some parameter's .grad changed}``, the last one ``{"raised":
    record}`` when the answer raised there."""
    import torch

    out = []
    for _, model, loss_fn, x, y, _ in per_sample_cases(name, seed, device):
        params = dict(model.named_parameters())
        before = {n: p.detach().clone() for n, p in params.items()}
        first = next(iter(params.values()))
        leftover = name == "one_vectorized_call_model_untouched"
        if leftover:
            first.grad = torch.full_like(first, 7.0)
        calls = []
        handle = model.register_forward_pre_hook(lambda mod, args: calls.append(1))
        try:
            got = per_sample_grads(model, loss_fn, x, y)
        except Exception as exc:
            out.append({"raised": raised(exc)})
            break
        finally:
            handle.remove()
        now = dict(model.named_parameters())
        out.append({
            "got": shown(got), "runs": len(calls),
            "replaced": list(now) != list(params) or any(now[n] is not params[n]
                                                         for n in params),
            "changed": [n for n, p in params.items() if not torch.equal(p.detach(), before[n])],
            "grads_changed": (first.grad is None if leftover else first.grad is not None)
            or (leftover and not torch.equal(first.grad, torch.full_like(first, 7.0)))
            or any(p.grad is not None for p in list(params.values())[1:])})
    return out


# --------------------------------------------------------------------------- checkpoint
def checkpoint_block(gen, dims, device, dropout: float = 0.0):
    """An ``nn.Sequential`` of Linear layers of widths ``dims`` (Tanh and GELU in turn after
    each, and ``Dropout(dropout)`` when given), its parameters drawn from ``gen``."""
    import torch
    from torch import nn

    layers = []
    for i in range(len(dims) - 1):
        lin = _quietly(lambda i=i: nn.Linear(dims[i], dims[i + 1]))
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / dims[i] ** 0.5)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.1)
        layers += [lin, nn.Tanh() if i % 2 == 0 else nn.GELU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers).to(device)


def checkpoint_case(name: str, seed: int, device: str = "cpu") -> dict:
    """What check ``name`` of ``autograd.checkpoint`` runs, built from generator ``seed`` +
    the check's offset: a dict of ``blocks`` (the modules, in order), ``x`` (the input, which
    requires grad), ``leaves`` and ``names`` (what gets gradients, and their names), ``fns``
    (the functions checkpointed, in order) and, for some checks, ``seed`` (the global RNG seed
    set before a run), ``label`` and the other arguments of the second segment."""
    import torch

    if name == "gradients_match_autograd":
        gen = generator(seed, 10)
        block = checkpoint_block(gen, [6, 9, 5], device)
        x = torch.randn(4, 6, generator=gen).to(device).requires_grad_()
        return {"blocks": [block], "x": x, "fns": [block], "leaves": [x, *block.parameters()],
                "names": ["x"] + [f"block.{n}" for n, _ in block.named_parameters()]}
    if name == "recomputes_once_saves_only_inputs":
        gen = generator(seed, 11)
        block = checkpoint_block(gen, [5, 7, 7, 3], device)
        x = torch.randn(3, 5, generator=gen).to(device).requires_grad_()
        return {"blocks": [block], "x": x, "fns": [block], "leaves": [x, *block.parameters()],
                "names": ["x"] + [f"block.{n}" for n, _ in block.named_parameters()]}
    if name == "mixed_arguments_and_segments":
        gen = generator(seed, 12)
        n = ri(gen, 1, 5)
        d = [int(v) for v in torch.randint(2, 10, (4,), generator=gen)]
        block1 = checkpoint_block(gen, d[:3], device)
        block2 = checkpoint_block(gen, [d[2], d[3]], device)
        x = torch.randn(n, d[0], generator=gen).to(device).requires_grad_()
        b = torch.randn(d[3], generator=gen).to(device).requires_grad_()
        mask = (torch.rand(n, d[3], generator=gen) > 0.3).to(device)     # bool, no grad
        const = torch.randn(d[3], generator=gen).to(device)              # float, no grad
        scale = float(torch.rand(1, generator=gen)) + 0.5

        def segment2(h, mask, scale, b, const):
            return block2(h) * mask * scale + b * const

        return {"blocks": [block1, block2], "x": x, "fns": [block1, segment2],
                "others": [mask, scale, b, const],
                "leaves": [x, b, *block1.parameters(), *block2.parameters()],
                "names": ["x", "b"] + [f"block1.{k}" for k, _ in block1.named_parameters()]
                + [f"block2.{k}" for k, _ in block2.named_parameters()],
                "label": f"two segments, batch {n}, dims {d}, a bool mask, a float and "
                         "tensors without grad among the arguments"}
    if name == "dropout_rng_replayed":
        gen = generator(seed, 13)
        rng_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        n = ri(gen, 2, 6)
        block = checkpoint_block(gen, [7, 11, 6], device, dropout=0.5)
        x = torch.randn(n, 7, generator=gen).to(device).requires_grad_()
        return {"blocks": [block], "x": x, "fns": [block], "seed": rng_seed,
                "leaves": [x, *block.parameters()],
                "names": ["x"] + [f"block.{k}" for k, _ in block.named_parameters()],
                "label": f"dropout(p=0.5) inside fn, batch {n}"}
    if name == "rng_stream_left_alone":
        gen = generator(seed, 14)
        rng_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
        block = checkpoint_block(gen, [4, 6, 4], device, dropout=0.25)
        x = torch.randn(3, 4, generator=gen).to(device).requires_grad_()
        return {"blocks": [block], "x": x, "fns": [block], "seed": rng_seed,
                "leaves": [x, *block.parameters()], "names": ["x"]}
    raise ValueError(f"no checkpoint check {name!r}")


def rng_fork(device):
    """Fork the global RNG(s) of the CPU (and of ``device`` when it is a GPU)."""
    import torch

    devices = [torch.device(device).index or 0] if str(device).startswith("cuda") else []
    return torch.random.fork_rng(devices=devices)


class _Counted:
    """Wraps ``fn`` and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


def _plain_tensor(t) -> bool:
    import torch

    return type(t) in (torch.Tensor, torch.nn.Parameter)


@probe
def checkpoint_run(checkpoint, name: str, seed: int, device: str = "cpu") -> dict:
    """Run ``checkpoint`` as check ``name`` does on :func:`checkpoint_case` ``(name, seed,
    device)``: each function of ``fns`` through ``checkpoint(fn, ...)`` (counting fn's calls,
    packs recorded by saved-tensor hooks), a backward of a scalar, the leaves' ``.grad``. Returns
    a dict of what was reached, in this order, and ``"raised"`` (a record) when the answer raised
    on the way:

    - ``"outs"``: what each ``checkpoint`` call returned, as :func:`marker` names it (the run
      stops at the first that is no plain tensor);
    - ``"calls"``: how often each fn ran during the forward; ``"packed"``: what the forward
      packed, each ``{"type", "base", "shape", "argument"`` (whether it is a tensor argument of
      a checkpoint call, by ``data_ptr()``; only for plain tensors)``}``, and
      ``"requires_grad"``: whether the last output requires grad;
    - ``"calls_after"``: how often each fn ran after the backward; ``"grads"``: each leaf's
      ``.grad`` (:func:`shown`), or ``"rng_after"``: the 8 numbers ``torch.rand`` drew after it
      (check ``rng_stream_left_alone``).
    """
    import torch

    case = checkpoint_case(name, seed, device)
    fns = [_Counted(fn) for fn in case["fns"]]
    x, got = case["x"], {}
    packed: list = []

    def pack(t):
        packed.append(t)
        return t.detach()

    try:
        with rng_fork(device):
            if "seed" in case:
                torch.manual_seed(case["seed"])
            outs, args = [], []
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                for i, fn in enumerate(fns):
                    a = [x] if i == 0 else [outs[-1], *case["others"]]
                    args += [t for t in a if isinstance(t, torch.Tensor)]
                    out = checkpoint(fn, *a)
                    outs.append(out)
                    got.setdefault("outs", []).append(marker(out))
                    if not _plain_tensor(out):
                        return got
            allowed = {t.data_ptr() for t in args}
            got["calls"] = [fn.calls for fn in fns]
            got["packed"] = [{**marker(t), "shape": list(t.shape) if _plain_tensor(t) else None,
                              "argument": _plain_tensor(t) and t.data_ptr() in allowed}
                             for t in packed]
            got["requires_grad"] = bool(outs[-1].requires_grad)
            if name == "rng_stream_left_alone":
                torch.rand(5, device=device)    # other code draws numbers between the passes
                outs[-1].sum().backward()
                got["rng_after"] = torch.rand(8, device=device)
            else:
                loss = outs[-1].sum() if name == "recomputes_once_saves_only_inputs" \
                    else outs[-1].pow(2).sum()
                loss.backward()
                got["grads"] = [shown(t.grad) for t in case["leaves"]]
            got["calls_after"] = [fn.calls for fn in fns]
    except Exception as exc:
        got["raised"] = raised(exc)
    return got


# --------------------------------------------------------------------------- saved-tensor-hooks
#: what a subclass of saved_tensors_hooks may not redefine: the probe runs the hooks the object
#: stores (pack_hook / unpack_hook, set by saved_tensors_hooks.__init__) through its own __enter__
HOOKS_FIXED = ("__enter__", "__exit__", "__getattribute__", "__getattr__", "__dict__")
#: what a namedtuple class must leave as tuple's own for its items to be what they seem
_TUPLE_DUNDERS = ("__iter__", "__len__", "__getitem__", "__contains__", "__eq__", "__ne__",
                  "__bool__", "__getattribute__", "__getattr__", "__reversed__")


def _plain_namedtuple(value) -> bool:
    """Whether ``value`` is an instance of a namedtuple class that redefines none of tuple's
    dunders and holds nothing besides its items: then ``tuple.__iter__(value)`` gives exactly
    what it holds."""
    cls = type(value)
    if not isinstance(value, tuple) or cls is tuple \
            or not isinstance(getattr(cls, "_fields", None), tuple):
        return False
    own = [k for k in cls.__mro__ if k not in (tuple, object)]
    if any(name in vars(k) for k in own for name in _TUPLE_DUNDERS):
        return False
    try:
        object.__getattribute__(value, "__dict__")
    except AttributeError:
        return True
    return False


def hooks_shape(hooks) -> dict:
    """What the object ``compressed_saved_tensors(dtype)`` returned is: ``{"type": its type's
    name, "is_hooks": whether it is a saved_tensors_hooks, "redefined": what of
    :data:`HOOKS_FIXED` (and which of pack_hook / unpack_hook as data descriptors) a subclass
    redefines, "has_hooks": whether it stores callable pack_hook and unpack_hook}``."""
    import torch

    base = torch.autograd.graph.saved_tensors_hooks
    seen = {"type": type(hooks).__name__, "is_hooks": isinstance(hooks, base), "redefined": [],
            "has_hooks": False}
    if not seen["is_hooks"]:
        return seen
    own = [k for k in type(hooks).__mro__ if k not in (base, object)]

    def descriptor(value):
        return hasattr(type(value), "__set__") or hasattr(type(value), "__delete__")

    seen["redefined"] = [name for name in HOOKS_FIXED if any(name in vars(k) for k in own)] + [
        name for name in ("pack_hook", "unpack_hook")
        if any(name in vars(k) and descriptor(vars(k)[name]) for k in own)]
    if not seen["redefined"]:
        stored = object.__getattribute__(hooks, "__dict__")
        seen["has_hooks"] = bool(type(stored) is dict and callable(stored.get("pack_hook"))
                                 and callable(stored.get("unpack_hook")))
    return seen


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def held(obj, depth: int = 0) -> list:
    """The tensors a packed object holds (a tensor, tuples/lists/dicts, a namedtuple, an object's
    attributes, a function's closure; 4 levels deep), in the order they are reached, each
    ``{**marker, "depth", "dtype", "numel", "shape", "requires_grad"}`` (the last four only for a
    plain tensor), and where the walk could not look inside honestly (a container that is no
    exact tuple, list, dict or namedtuple; an object whose ``__dict__`` is no dict) an entry
    ``{"refused": marker, "depth", "dict": whether it was a __dict__}``."""
    import types

    import torch

    if isinstance(obj, torch.Tensor):
        entry = {**marker(obj), "depth": depth}
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            entry.update(dtype=obj.dtype, numel=obj.numel(), shape=list(obj.shape),
                         requires_grad=bool(obj.requires_grad))
        return [entry]
    if depth > 4:
        return []
    if _plain_namedtuple(obj):
        items = list(tuple.__iter__(obj))
    elif isinstance(obj, (tuple, list, dict)):
        if type(obj) not in (tuple, list, *_DICTS):
            return [{"refused": marker(obj), "depth": depth, "dict": False}]
        items = list(dict.values(obj)) if isinstance(obj, dict) else list(obj)
    elif isinstance(obj, types.FunctionType):
        items = [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        attributes = object.__getattribute__(obj, "__dict__")
        if type(attributes) is not dict:
            return [{"refused": marker(attributes), "depth": depth, "dict": True}]
        items = list(attributes.values())
    else:
        return []
    return [entry for item in items for entry in held(item, depth + 1)]


def _unpacked(out) -> dict:
    """What an unpack hook returned: its :func:`marker`, and for a plain tensor its ``dtype``,
    ``shape``, ``device`` and ``value``."""
    import torch

    entry = marker(out)
    if type(out) in (torch.Tensor, torch.nn.Parameter):
        entry.update(dtype=out.dtype, shape=list(out.shape), device=out.device,
                     value=out.detach())
    return entry


def hooks_mlp(gen, dims, dtype, device):
    """An ``nn.Sequential`` of Linear layers of widths ``dims`` (Tanh, GELU, Sigmoid, SiLU in
    turn after each), its parameters drawn from ``gen``, in ``dtype`` on ``device``."""
    import torch
    from torch import nn

    layers = []
    acts = [nn.Tanh, nn.GELU, nn.Sigmoid, nn.SiLU]
    for i in range(len(dims) - 1):
        lin = _quietly(lambda i=i: nn.Linear(dims[i], dims[i + 1]))
        with torch.no_grad():
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen) / dims[i] ** 0.5)
            lin.bias.copy_(torch.randn(lin.bias.shape, generator=gen) * 0.1)
        layers += [lin, acts[i % len(acts)]()]
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def _mlp_forward(gen, dims, batch, dtype, device):
    import torch

    model = hooks_mlp(gen, dims, dtype, device)
    x = torch.randn(batch, dims[0], generator=gen, dtype=dtype).to(device).requires_grad_()
    return [x, *model.parameters()], lambda: (model(x) ** 2).sum()


def hooks_cases(name: str, seed: int, device: str = "cpu"):
    """The cases check ``name`` of ``autograd.saved-tensor-hooks`` runs, built lazily in order
    (they share a generator): yields dicts of ``label``, ``target`` (the dtype the answer is
    called with), ``leaves``, ``forward`` (a callable returning a scalar loss, or for ``kind``
    "dropped", the tensors that must die) and ``kind``: "grads" (the answer's hooks themselves),
    "spied" (its hooks under a spy), "exact16" (a float16 product, under a spy) or "dropped" (a
    graph built and dropped without backward)."""
    import torch
    from torch import nn

    bf16 = torch.bfloat16
    if name == "gradients_close_to_uncompressed":
        leaves, forward = _mlp_forward(generator(seed, 0), [6, 8, 5], 4, torch.float32, device)
        yield {"label": "small MLP, dtype=torch.bfloat16", "target": bf16, "leaves": leaves,
               "forward": forward, "kind": "grads"}
    elif name == "packs_narrow_and_restores":
        leaves, forward = _mlp_forward(generator(seed, 1), [5, 7, 3], 3, torch.float32, device)
        yield {"label": "small MLP, dtype=torch.bfloat16", "target": bf16, "leaves": leaves,
               "forward": forward, "kind": "spied"}
    elif name == "dropped_graph_is_freed":
        gen = generator(seed, 5)
        a = torch.randn(6, generator=gen).to(device=device, dtype=torch.float16)

        def forward():
            t = a.detach().requires_grad_()
            y = torch.exp(t * 0.5)                    # ExpBackward0 saves its own output, y
            z = torch.tanh(y)                         # TanhBackward0 saves its own output, z
            return [y, z, (z * y).sum()]
        yield {"label": "", "target": bf16, "leaves": [], "forward": forward, "kind": "dropped"}
    elif name == "integer_saved_tensors_untouched":
        gen = generator(seed, 2)
        rows = 1000 + ri(gen, 0, 499)
        emb = _quietly(lambda: nn.Embedding(rows, 6))
        with torch.no_grad():
            emb.weight.copy_(torch.randn(rows, 6, generator=gen))
        emb = emb.to(device)
        idx = torch.randint(0, rows, (9, 4), generator=gen).to(device)
        pick = torch.randint(0, 6, (9, 4, 1), generator=gen).to(device)
        w = torch.randn(6, generator=gen).to(device).requires_grad_()

        def forward():
            h = emb(idx) * w                          # EmbeddingBackward0 saves the int64 indices
            top, _ = h.max(dim=-1)                    # MaxBackward0 saves int64 indices
            g = h.gather(-1, pick).squeeze(-1)        # GatherBackward0 saves the int64 index
            return (top.sigmoid() * g).sum()
        yield {"label": f"embedding({rows} rows) + max + gather", "target": bf16,
               "leaves": [emb.weight, w], "forward": forward, "kind": "spied"}
    elif name == "other_dtypes_and_random_shapes":
        gen = generator(seed, 3)
        for dtype, target in [(torch.float32, torch.float16), (torch.float64, bf16),
                              (torch.float64, torch.float16)]:
            depth = ri(gen, 2, 4)
            dims = [int(d) for d in torch.randint(1, 12, (depth + 1,), generator=gen)]
            batch = ri(gen, 1, 7)
            leaves, forward = _mlp_forward(gen, dims, batch, dtype, device)
            yield {"label": f"random MLP {dims}, batch {batch}, {dtype} model, dtype={target}",
                   "target": target, "leaves": leaves, "forward": forward, "kind": "spied"}
        # a float16 tensor saved under a bfloat16 target is already 2 bytes wide: keep it as is
        a = torch.randn(5, 3, generator=gen).to(device=device, dtype=torch.float16)
        b = torch.randn(5, 3, generator=gen).to(device=device, dtype=torch.float16)
        a, b = a.requires_grad_(), b.requires_grad_()
        yield {"label": "a * b in float16", "target": bf16, "leaves": [a, b],
               "forward": lambda: (a * b).sum(), "kind": "exact16"}
    elif name == "parameters_saved_directly":
        gen = generator(seed, 4)
        n, k, m = (int(d) for d in torch.randint(2, 9, (3,), generator=gen))
        W = nn.Parameter(torch.randn(k, m, generator=gen).to(device))
        V = nn.Parameter(torch.randn(m, k, generator=gen).to(device))
        x = torch.randn(n, k, generator=gen).to(device).requires_grad_()
        yield {"label": f"x @ W with W a Parameter ({n}x{k} @ {k}x{m})", "target": bf16,
               "leaves": [x, W, V], "kind": "spied",
               "forward": lambda: (torch.tanh(x @ W) @ V).pow(2).sum()}  # mm saves W, V
    else:
        raise ValueError(f"no saved-tensor-hooks check {name!r}")


def _hooks_case(compressed_saved_tensors, case: dict) -> dict:
    """One case of :func:`hooks_runs`, as far as it gets."""
    import gc
    import weakref

    import torch

    got: dict = {}
    stage = "call"
    try:
        hooks = compressed_saved_tensors(case["target"])
        got["hooks"] = hooks_shape(hooks)
        if not got["hooks"]["has_hooks"]:
            return got
        if case["kind"] == "dropped":
            stage = "forward"
            with hooks:                      # float16 under bfloat16: nothing is compressed
                made = case["forward"]()
            alive = [weakref.ref(t) for t in made[:2]]
            del made
            if any(ref() is not None for ref in alive):
                gc.collect()                 # (slow: only when reference counts did not do)
            got["alive"] = any(ref() is not None for ref in alive)
            return got
        records: list = []
        if case["kind"] == "grads":
            context = hooks
        else:
            pack_hook, unpack_hook = hooks.pack_hook, hooks.unpack_hook

            def pack(t):
                records.append({"packed": pack_hook(t), "out": None})
                return len(records) - 1

            def unpack(i):
                out = records[i]["out"] = unpack_hook(records[i]["packed"])
                return out
            context = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        for t in case["leaves"]:
            t.grad = None
        stage = "forward"
        with context:
            loss = case["forward"]()
        stage = "backward"
        loss.backward()
        stage = "report"
        got["grads"] = [shown(t.grad) for t in case["leaves"]]
    except Exception as exc:
        got.update(raised=raised(exc), stage=stage, runtime_error=isinstance(exc, RuntimeError))
        return got
    finally:
        if case["kind"] != "grads" and "hooks" in got and got["hooks"]["has_hooks"] \
                and case["kind"] != "dropped":
            got["records"] = [{"held": held(r["packed"]),
                               "out": None if r["out"] is None else _unpacked(r["out"])}
                              for r in records]
    return got


@probe
def hooks_runs(compressed_saved_tensors, name: str, seed: int, device: str = "cpu") -> list:
    """Each case of :func:`hooks_cases` ``(name, seed, device)`` run with the answer's hooks, in
    order, up to the first that fails to finish. Returns one dict per case: ``"hooks"``: what
    ``compressed_saved_tensors(target)`` returned (:func:`hooks_shape`); for kind "dropped",
    ``"alive"``: whether the graph built under the hooks outlived being dropped; else ``"grads"``:
    the leaves' ``.grad`` after a forward under the hooks and a backward (:func:`shown`), and for
    kinds "spied" and "exact16" ``"records"``: one per tensor packed, in order, ``{"held": what
    the answer's pack hook returned holds (:func:`held`), "out": what its unpack hook last
    returned for it (:func:`_unpacked`), or None}``. When the answer raised: ``"raised"`` (a
    record), ``"stage"`` ("call", "forward", "backward") and ``"runtime_error"``."""
    out = []
    for case in hooks_cases(name, seed, device):
        got = _hooks_case(compressed_saved_tensors, case)
        out.append(got)
        if "raised" in got or not got.get("hooks", {}).get("has_hooks"):
            break
    return out


# --------------------------------------------------------------------------- derivatives
def _derivative_apply(Fn, values: list):
    """``Fn.apply`` on fresh leaves made from ``values``: ``(out, leaves, report)``, the report
    ``{"out": shown(out), "recorded": whether out.grad_fn is the node Fn.apply recorded,
    "grad_fn": its type's name}``."""
    import torch
    from torch.autograd.function import BackwardCFunction

    leaves = [v.detach().clone().requires_grad_() if isinstance(v, torch.Tensor) else v
              for v in values]
    out = Fn.apply(*leaves)
    node = getattr(out, "grad_fn", None) if type(out) is torch.Tensor else None
    return out, leaves, {
        "out": shown(out), "grad_fn": type(node).__name__,
        "recorded": isinstance(node, BackwardCFunction)
        and getattr(node, "_forward_cls", None) is Fn}


def _derivative_request(generate_backward, request: dict) -> dict:
    """One request of :func:`derivative_runs`, as far as it gets."""
    import copy

    import torch

    got: dict = {}
    try:
        Fn = generate_backward(copy.deepcopy(request["entry"]))
        got["function"] = isinstance(Fn, type) and issubclass(Fn, torch.autograd.Function)
        got["type"] = type(Fn).__name__
        if not got["function"]:
            return got
        if request.get("compare") is not None:
            out, leaves, got["compare"] = _derivative_apply(Fn, request["compare"]["values"])
            if type(out) is torch.Tensor and got["compare"]["recorded"]:
                tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
                try:
                    grads = torch.autograd.grad(out, tensors, request["compare"]["v"],
                                                allow_unused=True)
                except RuntimeError as exc:
                    got["compare"]["grads_raised"] = raised(exc)
                else:
                    got["compare"]["grads"] = [shown(g) for g in grads]
        if request.get("saved") is not None:
            out, _, got["saved"] = _derivative_apply(Fn, request["saved"]["values"])
            if type(out) is torch.Tensor and got["saved"]["recorded"]:
                node = out.grad_fn
                got["saved"]["names"] = shown(getattr(node, "saved_names", None))
                got["saved"]["tensors"] = [shown(t) for t in node.saved_tensors]
                own = node.__dict__
                got["saved"]["attributes"] = {k: shown(own[k]) for k in request["saved"]["keys"]
                                              if k in own}
    except Exception as exc:
        got["raised"] = raised(exc)
    return got


@probe
def derivative_runs(generate_backward, requests: list) -> list:
    """For each request ``{"entry": a derivatives.yaml entry (a dict), "compare": {"values",
    "v"} or None, "saved": {"values", "keys"} or None}``, in order up to the first where the
    answer raised: ``Fn = generate_backward(copy of entry)``, then

    - ``"compare"``: ``Fn.apply`` on leaves made from ``values`` (arguments in schema order)
      (:func:`_derivative_apply`) and, when its output is recorded by Fn's node,
      ``"grads"``: ``torch.autograd.grad(out, tensor leaves, v, allow_unused=True)``
      (:func:`shown`), or ``"grads_raised"`` (a record of the RuntimeError it raised);
    - ``"saved"``: the same on other values, then from the node: ``"names"``:
      ``ctx.saved_names``, ``"tensors"``: ``ctx.saved_tensors``, ``"attributes"``: the node's
      attributes of the names in ``keys`` (all :func:`shown`).

    Returns one dict per request with ``"function"`` (whether Fn is a class deriving from
    torch.autograd.Function), ``"type"`` and those, or ``"raised"``."""
    out = []
    for request in requests:
        got = _derivative_request(generate_backward, request)
        out.append(got)
        if "raised" in got:
            break
    return out


# --------------------------------------------------------------------------- forward-ad
def _fad_matrix(g, rows: int, cols: int, dtype):
    import torch

    return torch.randn(rows, cols, generator=g, dtype=dtype) / rows ** 0.5


def fad_random_body(g, shape, dtype):
    """A seeded chain of ops on one tensor of ``shape``, with at least one logsumexp: the body
    ``(lse, x) -> tensor`` of a program."""
    import torch

    steps, dims = [], list(shape)
    n = ri(g, 2, 4)
    lse_at = ri(g, 0, n - 1) if dims else -1
    unary = [torch.sin, torch.tanh, torch.sigmoid, lambda t: t.sin().exp(), lambda t: t * t]
    # (no Python-scalar arithmetic: under jacfwd its decomposition imports torch._dynamo)
    for k in range(n):
        if k == lse_at or (dims and k == n - 1 and lse_at < 0):
            d = ri(g, -len(dims), len(dims) - 1)
            steps.append(("lse", d))
            dims.pop(d)
            lse_at = -2
        elif dims and torch.rand((), generator=g) < 0.4:
            cols = ri(g, 1, 4)
            steps.append(("mm", _fad_matrix(g, dims[-1], cols, dtype)))
            dims[-1] = cols
        else:
            steps.append(("op", unary[ri(g, 0, len(unary) - 1)]))

    def body(lse, x):
        for kind, arg in steps:
            x = lse(x, arg) if kind == "lse" else x @ arg if kind == "mm" else arg(x)
        return x

    return body


def _fad_shape(g, low: int = 1, high: int = 4) -> tuple:
    return (ri(g, low, high), ri(g, low, high))


def _fad_lse(g, x, dim: int, where: str) -> dict:
    import torch

    u = torch.randn(x.shape, generator=g, dtype=x.dtype) * (
        0.1 + 5 * torch.rand((), generator=g, dtype=x.dtype))
    return {"kind": "lse", "where": where, "x": x, "dim": dim, "u": u}


def _fad_backward(g, x, dim: int, where: str) -> dict:
    import torch

    u = torch.randn(x.shape, generator=g, dtype=x.dtype)
    w = torch.randn(torch.logsumexp(x, dim).shape, generator=g, dtype=x.dtype)
    return {"kind": "backward", "where": where, "x": x, "dim": dim, "u": u, "w": w}


def _fad_jvp(g, body, primals: tuple, where: str) -> dict:
    import torch

    tangents = tuple(torch.randn(p.shape, generator=g, dtype=p.dtype) * 3 for p in primals)
    return {"kind": "jvp", "where": where, "body": body, "primals": primals,
            "tangents": tangents}


def forward_ad_cases(name: str, seed: int) -> list:
    """The cases check ``name`` of ``autograd.forward-ad`` runs, in order: dicts with ``"kind"``
    ("lse": ``x``, ``dim``, tangent ``u``; "backward": ``x``, ``dim``, ``u``, cotangent ``w``;
    "jvp": ``body``, ``primals``, ``tangents``; "jacobian": ``body``, ``x``) and ``"where"``.
    A body is ``(lse, *tensors) -> tensor or tuple``: the program with ``lse`` for logsumexp."""
    import torch

    f64 = torch.float64
    cases = []
    if name == "logsumexp_values_and_jvp":
        g = generator(seed, 80)
        x = torch.randn(3, 4, generator=g, dtype=f64)
        for dim in (0, 1, -1):
            cases.append(_fad_lse(g, x, dim, "x of shape (3, 4)"))
        huge = torch.randn(2, 5, generator=g, dtype=f64) * 1e4
        cases.append(_fad_lse(g, huge, 1, "inputs of magnitude ~1e4"))
    elif name == "logsumexp_jvp_agrees_with_backward":
        g = generator(seed, 81)
        for dim in (1, 0):
            x = torch.randn(4, 3, generator=g, dtype=f64) * 3
            cases.append(_fad_backward(g, x, dim, "x of shape (4, 3)"))
    elif name == "jvp_matches_torch_func_jvp":
        g = generator(seed, 82)
        w = _fad_matrix(g, 4, 2, f64)

        def one(lse, a):
            return lse(a.sin() @ w, 0)

        def two(lse, a, b):
            return (a * b.tanh(), lse(a @ w + b[:, :2], 1), torch.ones(3, dtype=a.dtype))

        a = torch.randn(3, 4, generator=g, dtype=f64)
        b = torch.randn(3, 4, generator=g, dtype=f64)
        cases.append(_fad_jvp(g, one, (a,), "fn(a) = logsumexp(a.sin() @ W, 0)"))
        cases.append(_fad_jvp(g, two, (a, b), "fn(a, b) = (a * b.tanh(), "
                              "logsumexp(a @ W + b[:, :2], 1), ones(3))"))
    elif name == "jacobian_matches_jacfwd":
        g = generator(seed, 83)
        w = _fad_matrix(g, 3, 5, f64)

        def body(lse, x):
            return lse(x.tanh() @ w, 0)  # (2, 3) -> (5,)

        x = torch.randn(2, 3, generator=g, dtype=f64)
        cases.append({"kind": "jacobian", "body": body, "x": x,
                      "where": "fn(x) = logsumexp(x.tanh() @ W, 0), x (2, 3)"})
    elif name == "random_programs":
        g = generator(seed, 84)
        for dtype in (f64, f64, torch.float32):
            shape = _fad_shape(g)
            body = fad_random_body(g, shape, dtype)
            x = torch.randn(shape, generator=g, dtype=dtype)
            where = f"a random program on x of shape {shape}, {dtype}"
            cases.append(_fad_jvp(g, body, (x,), where))
            cases.append({"kind": "jacobian", "body": body, "x": x, "where": where})
    elif name == "zero_dim_and_several_inputs":
        g = generator(seed, 85)
        k = ri(g, 2, 4)

        def scalar_to_vector(lse, s):  # (no 0-d * tensor: under torch.func it imports dynamo)
            return torch.stack([s.sin(), s.cos(), s.tanh()]).exp()

        def vector_to_scalar(lse, x):
            return lse(x * x, 0).sigmoid()

        def three(lse, a, b, c):
            return (lse(torch.stack([a, b * c]), 0), c, torch.zeros(2, dtype=a.dtype), a.tanh())

        s = torch.randn((), generator=g, dtype=f64)
        x = torch.randn(k, generator=g, dtype=f64)
        cases.append({"kind": "jacobian", "body": scalar_to_vector, "x": s,
                      "where": "a 0-d x, fn(x) of shape (3,)"})
        cases.append({"kind": "jacobian", "body": vector_to_scalar, "x": x,
                      "where": f"x of shape ({k},), a 0-d fn(x)"})
        cases.append(_fad_jvp(g, vector_to_scalar, (x,), f"x of shape ({k},), a 0-d fn(x)"))
        abc = tuple(torch.randn(k, generator=g, dtype=f64) for _ in range(3))
        cases.append(_fad_jvp(g, three, abc, "fn(a, b, c) = (logsumexp(stack([a, b * c]), 0), "
                              "c, zeros(2), a.tanh())"))
    elif name == "logsumexp_random_shapes":
        g = generator(seed, 86)
        for dtype, scale in ((f64, 1.0), (f64, 300.0), (torch.float32, 30.0)):
            shape = (*_fad_shape(g), ri(g, 1, 3))
            dim = ri(g, -3, 2)
            x = torch.randn(shape, generator=g, dtype=dtype) * scale
            where = f"x of shape {shape}, {dtype}, magnitudes ~{scale:g}"
            cases.append(_fad_lse(g, x, dim, where))
            if dtype == f64:
                cases.append(_fad_backward(g, x, dim, where))
    else:
        raise ValueError(f"no forward-ad check {name!r}")
    return cases


class _Refused(Exception):
    """Raised by :class:`_Watch` into the answer at a refused call, before its body runs."""


class _Misuse(Exception):
    """Raised by :class:`_Program` into the answer when it calls ``fn`` with what it must not."""


_HERE = (lambda: 0).__code__.co_filename


def _oracles() -> dict:
    """torch's own derivatives an answer must not call: ``{code: name}``."""
    import inspect

    import torch
    import torch.autograd.functional as functional
    from torch._functorch import eager_transforms as tr

    return {inspect.unwrap(f).__code__: name for f, name in (
        (tr._jvp_with_argnums, "torch.func.jvp (or jacfwd)"),
        (tr._vjp_with_argnums, "torch.func.vjp (or jacrev)"),
        (tr.grad_and_value_impl, "torch.func.grad"),
        (tr.linearize, "torch.func.linearize"),
        (torch.autograd.grad, "torch.autograd.grad"),
        (torch.autograd.backward, "torch.autograd.backward (Tensor.backward)"),
        (functional.jacobian, "torch.autograd.functional.jacobian"),
        (functional.hessian, "torch.autograd.functional.hessian"),
        (functional.jvp, "torch.autograd.functional.jvp"),
        (functional.vjp, "torch.autograd.functional.vjp"),
        (functional.hvp, "torch.autograd.functional.hvp"),
        (functional.vhp, "torch.autograd.functional.vhp"),
    )}


class _Watch:
    """A profile hook (``sys.setprofile``) that sees each call of one of torch's derivatives
    made from the answer's code (the innermost frame outside the installed libraries is not this
    module's), and each ``make_dual`` made under one of ``LogSumExp``'s own methods: it records
    ``[name, the caller's qualname]`` in ``used`` and raises :class:`_Refused` into the call."""

    def __init__(self, function_cls):
        import inspect

        import torch
        import torch.autograd.forward_ad as fwAD

        own = [k for k in function_cls.__mro__ if k not in torch.autograd.Function.__mro__]
        self.function_codes = {
            inspect.unwrap(v.__func__ if isinstance(v, staticmethod) else v).__code__
            for k in own for v in vars(k).values()
            if inspect.isfunction(v) or isinstance(v, staticmethod)}
        self.oracles, self.make_dual, self.used = _oracles(), fwAD.make_dual.__code__, []

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        name = self.oracles.get(code)
        if name is None and code is not self.make_dual:
            return
        f = frame.f_back
        while f is not None and f.f_code.co_filename != _HERE:
            if name is None and f.f_code in self.function_codes:
                self.used.append(["fwAD.make_dual", f.f_code.co_qualname])
                raise _Refused
            if name is not None and "/lib/python" not in f.f_code.co_filename:
                self.used.append([name, f.f_code.co_qualname])
                raise _Refused
            f = f.f_back


class _Program:
    """``fn(*tensors)`` for the answer: ``body(lse, *tensors)`` with the answer's LogSumExp,
    after looking at every argument; the first misuse is kept in ``misuse`` (``[what, type
    name]``: "not a tensor", "wrapped" by a torch.func transform, "requires grad", "no tangent"
    at the current forward level) and raised into the answer. ``calls`` counts the calls."""

    def __init__(self, body, L):
        self.body, self.calls, self.misuse = body, 0, None
        self.lse = lambda t, dim: L.apply(t, dim)

    def __call__(self, *args):
        import torch
        import torch.autograd.forward_ad as fwAD

        self.calls += 1
        for a in args:
            if not isinstance(a, torch.Tensor):
                why = "not a tensor"
            elif torch._C._functorch.is_functorch_wrapped_tensor(a):
                why = "wrapped"
            elif a.requires_grad:
                why = "requires grad"
            elif fwAD.unpack_dual(a).tangent is None:
                why = "no tangent"
            else:
                continue
            if self.misuse is None:
                self.misuse = [why, type(a).__name__]
            raise _Misuse(why)
        return self.body(self.lse, *args)


def _fad_dual(L, x, u, dim: int) -> dict:
    """``LogSumExp.apply`` on a dual tensor of ``x`` and ``u``: ``{"value", "tangent"}``
    (:func:`shown`)."""
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = L.apply(fwAD.make_dual(x, u), dim)
        value, tangent = fwAD.unpack_dual(out)
    return {"value": shown(value), "tangent": shown(tangent)}


def _fad_case(L, ForwardAD, case: dict, got: dict) -> None:
    """Run ``case`` (:func:`forward_ad_cases`), filling ``got`` as far as it gets."""
    import torch
    from torch.autograd.function import BackwardCFunction

    kind = case["kind"]
    if kind == "lse":
        got.update(_fad_dual(L, case["x"], case["u"], case["dim"]))
        dim = case["dim"]
        _, theirs = torch.func.jvp(lambda t: L.apply(t, dim), (case["x"],), (case["u"],))
        got["func_jvp"] = shown(theirs)
    elif kind == "backward":
        dual = _fad_dual(L, case["x"], case["u"], case["dim"])
        got["value"], got["ju"] = dual["value"], dual["tangent"]
        leaf = case["x"].detach().requires_grad_()
        out = L.apply(leaf, case["dim"])
        node = getattr(out, "grad_fn", None)
        got["grad_fn"] = type(node).__name__
        got["own_node"] = (isinstance(node, BackwardCFunction)
                           and getattr(node, "_forward_cls", None) is L)
        if got["own_node"]:
            (jtw,) = torch.autograd.grad(out, leaf, case["w"])
            got["jtw"] = shown(jtw)
    else:
        fn = _Program(case["body"], L)
        try:
            if kind == "jvp":
                got["got"] = shown(ForwardAD.jvp(fn, case["primals"], case["tangents"]))
            else:
                got["got"] = shown(ForwardAD.jacobian(fn, case["x"]))
        finally:
            got["calls"], got["misuse"] = fn.calls, fn.misuse


def _fad_parts(ForwardAD) -> dict:
    """What the structure of ``ForwardAD`` is, as the judge needs it."""
    import inspect

    import torch

    parts = {"class": isinstance(ForwardAD, type), "type": type(ForwardAD).__name__}
    if not parts["class"]:
        return parts
    parts["missing"] = [n for n in ("LogSumExp", "jvp", "jacobian") if not hasattr(ForwardAD, n)]
    if parts["missing"]:
        return parts
    L, F = ForwardAD.LogSumExp, torch.autograd.Function
    parts["lse_type"] = type(L).__name__
    parts["function"] = isinstance(L, type) and issubclass(L, F)
    if parts["function"]:
        parts["apply"] = inspect.getattr_static(L, "apply") is inspect.getattr_static(F, "apply")
        parts["jvp"] = L.jvp is not F.jvp
        parts["setup_context"] = L.setup_context is not F.setup_context
        parts["backward"] = not (L.backward is F.backward and L.vjp is F.vjp)
    return parts


@probe
def forward_ad_runs(ForwardAD, name: str, seed: int) -> dict:
    """Each case of :func:`forward_ad_cases` ``(name, seed)`` run with the answer, in order, up to
    the first that does not finish, while :class:`_Watch` looks on. Returns ``{"parts": the
    structure of ForwardAD (:func:`_fad_parts`), "refused": [torch's derivative, the answer's
    function that called it] or None, "cases": one dict per case}`` (no cases unless every part
    is in place). A case's dict holds, as far as it got (all tensors :func:`shown`):

    - "lse": ``"value"`` and ``"tangent"`` of ``LogSumExp.apply`` on the dual tensor of ``x`` and
      ``u``, and ``"func_jvp"``: the tangent ``torch.func.jvp`` gives through it;
    - "backward": ``"value"`` and ``"ju"``: that value and tangent, ``"grad_fn"`` (its type's
      name) and ``"own_node"`` of ``apply`` on a leaf, and when that is LogSumExp's node
      ``"jtw"``: the gradient with ``w``;
    - "jvp" / "jacobian": ``"got"``: what ``ForwardAD.jvp(fn, primals, tangents)`` or
      ``ForwardAD.jacobian(fn, x)`` returned, ``"calls"`` of ``fn`` and ``"misuse"``
      (:class:`_Program`);

    and ``"raised"`` (a record) when the answer raised."""
    import sys

    parts = _fad_parts(ForwardAD)
    reply = {"parts": parts, "refused": None, "cases": []}
    if not all(parts.get(k) for k in ("class", "function", "apply", "jvp", "setup_context",
                                      "backward")):
        return reply
    L = ForwardAD.LogSumExp
    watch, before = _Watch(L), sys.getprofile()
    sys.setprofile(watch)
    try:
        for case in forward_ad_cases(name, seed):
            got: dict = {}
            try:
                _fad_case(L, ForwardAD, case, got)
            except Exception as exc:
                got["raised"] = raised(exc)
            reply["cases"].append(got)
            if watch.used or "raised" in got:
                break
    finally:
        sys.setprofile(before)
        reply["refused"] = watch.used[0] if watch.used else None
    return reply


# --------------------------------------------------------------------------- hooks
#: the "own .grad" of an event of a Node hook (it has no tensor of its own)
HOOK_NA = "n/a"


def _hook_snap(value):
    """A gradient a hook was passed (or a ``.grad``), as plain data: None, a detached copy of a
    plain tensor, or :func:`shown` of anything else (the judge says what is wrong with it)."""
    import torch

    if type(value) in (torch.Tensor, torch.nn.Parameter):
        return value.detach().clone()
    return shown(value)


def _hook_snap_tuple(value):
    if type(value) is tuple:
        return tuple(_hook_snap(v) for v in value)
    return shown(value)


def _hook_grad(t):
    """``t.grad`` now (:func:`_hook_snap`), read without the non-leaf warning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = t.grad
    return _hook_snap(g)


def _hook_times(grads, scale):
    """A hook's return value: each gradient times ``scale`` (None stays None), or None."""
    if scale is None or type(grads) is not tuple or not grads:
        return None
    return tuple(None if g is None else g * scale for g in grads)


class HookCase:
    """One graph with names for its tensors and the hooks to register on it, each recording its
    calls in ``events`` as ``[hook index, arguments (tuple), own .grad or HOOK_NA]`` (arguments
    and ``.grad`` by :func:`_hook_snap`; a post-accumulate-grad hook called with another object
    than its leaf records ``["other", its type's name]`` as its arguments)."""

    def __init__(self):
        self.tensors: dict = {}      # name -> tensor (leaves, intermediates, the output)
        self.hooks: list = []        # (kind, target, fn), in registration order
        self.about: list = []        # hook i in words
        self.node_of: list = []      # hook i: the name of the node it sits on
        self.node_names: dict = {}   # node -> its name
        self.events: list = []
        self.output = self.grad_output = self.inputs = None

    # building
    def leaf(self, name, g, shape, grad=False):
        """A float64 leaf from ``g``; ``grad``: give it an existing ``.grad`` too."""
        import torch

        t = torch.randn(shape, generator=g, dtype=torch.float64).requires_grad_()
        if grad:
            t.grad = torch.randn(shape, generator=g, dtype=torch.float64)
        return self.add(name, t)

    def add(self, name, t):
        self.tensors[name] = t
        return t

    def name_of(self, t) -> str:
        return next(n for n, u in self.tensors.items() if u is t)

    def node(self, name):
        """(node, its name, how to reach it from ``name``): the node ``name``'s gradient goes
        to (its grad_fn, or the leaf's AccumulateGrad)."""
        import torch

        t = self.tensors[name]
        node = torch.autograd.graph.get_gradient_edge(t).node
        path = f"{name}'s AccumulateGrad" if t.grad_fn is None else f"{name}.grad_fn"
        if node not in self.node_names:
            self.node_names[node] = (path if t.grad_fn is None
                                     else f"{path} ({node.name()})")
        return node, self.node_names[node], path

    def _hook(self, kind, target, fn, about, node_name):
        self.hooks.append((kind, target, fn))
        self.about.append(f"hook #{len(self.hooks) - 1} ({about})")
        self.node_of.append(node_name)

    def _scaled(self, scale) -> str:
        return "" if scale is None else f", which returns its argument * {scale}"

    def tensor_hook(self, name, scale=None):
        """``t.register_hook(fn)``; fn returns ``grad * scale`` unless ``scale`` is None."""
        import torch

        t, i = self.tensors[name], len(self.hooks)

        def fn(grad):
            self.events.append([i, (_hook_snap(grad),), _hook_grad(t)])
            if scale is None or not isinstance(grad, torch.Tensor):
                return None
            return grad * scale
        self._hook("tensor", t, fn, f"{name}.register_hook(fn){self._scaled(scale)}",
                   self.node(name)[1])

    def retain(self, name):
        """``t.retain_grad()`` (no calls to record: its effect is ``t.grad``)."""
        self._hook("retain_grad", self.tensors[name], None, f"{name}.retain_grad()",
                   self.node(name)[1])

    def pre(self, name, scale=None):
        """``node.register_prehook(fn)`` on the node of ``name``."""
        node, where, path = self.node(name)
        i = len(self.hooks)

        def fn(grad_outputs):
            self.events.append([i, (_hook_snap_tuple(grad_outputs),), HOOK_NA])
            return _hook_times(grad_outputs, scale)
        self._hook("pre", node, fn, f"{path}.register_prehook(fn){self._scaled(scale)}", where)

    def post(self, name, scale=None):
        """``node.register_hook(fn)`` on the node of ``name``."""
        node, where, path = self.node(name)
        i = len(self.hooks)

        def fn(grad_inputs, grad_outputs):
            self.events.append([i, (_hook_snap_tuple(grad_inputs),
                                    _hook_snap_tuple(grad_outputs)), HOOK_NA])
            return _hook_times(grad_inputs, scale)
        self._hook("post", node, fn, f"{path}.register_hook(fn){self._scaled(scale)}", where)

    def post_acc(self, name):
        """``leaf.register_post_accumulate_grad_hook(fn)``."""
        t, i = self.tensors[name], len(self.hooks)

        def fn(tensor):
            if tensor is not t:
                self.events.append([i, ["other", type(tensor).__name__], HOOK_NA])
                return
            self.events.append([i, (), _hook_grad(t)])
        self._hook("post_accumulate_grad", t, fn,
                   f"{name}.register_post_accumulate_grad_hook(fn)", self.node(name)[1])

    # running
    def register(self) -> None:
        """Register every hook for real, in order."""
        for kind, target, fn in self.hooks:
            if kind == "tensor":
                target.register_hook(fn)
            elif kind == "retain_grad":
                target.retain_grad()
            elif kind == "pre":
                target.register_prehook(fn)
            elif kind == "post":
                target.register_hook(fn)
            else:
                target.register_post_accumulate_grad_hook(fn)

    def nodes(self) -> list:
        """Every node reachable from the output's grad_fn."""
        root = self.output.grad_fn
        seen, stack = {root}, [root]
        while stack:
            for nxt, _ in stack.pop().next_functions:
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return list(seen)


def _hooks_one_node(c: HookCase, g) -> None:
    """Hooks of every kind on h = x * w and on x, registered in a mixed-up order."""
    import torch

    x = c.leaf("x", g, (3,), grad=True)
    w = c.leaf("w", g, (3,))
    h = c.add("h", x * w)
    c.output = c.add("out", (h.sin() * h).sum())
    c.grad_output = torch.randn((), generator=g, dtype=torch.float64)
    c.retain("h")
    c.tensor_hook("h", 2.0)
    c.pre("h")
    c.post("h", -1.5)
    c.tensor_hook("h")
    c.post_acc("x")
    c.tensor_hook("x", 0.5)
    c.pre("x")
    c.post("x")


def _hooks_branches(c: HookCase, g) -> None:
    """Two interleaved branches into a three-way split whose last output is unused."""
    import torch

    x = c.leaf("x", g, (2,))
    w = c.leaf("w", g, (2,))
    a = c.add("a", x.sin())
    b = c.add("b", w.tanh())
    a2 = c.add("a2", a * x)
    b2 = c.add("b2", b * w)
    p, q, r = torch.cat([a2, b2, a2]).split(2)
    for name, t in (("p", p), ("q", q), ("r", r)):
        c.add(name, t)
    c.output = c.add("out", p * q.exp())
    c.grad_output = torch.randn(2, generator=g, dtype=torch.float64)
    c.tensor_hook("q")
    c.tensor_hook("r", 3.0)
    c.tensor_hook("p", -1.0)
    c.tensor_hook("q", 2.0)
    c.retain("p")
    c.pre("a", 0.5)
    c.pre("b")
    c.post("a2")
    c.post("b2", 2.0)
    c.tensor_hook("x")
    c.post_acc("w")
    c.tensor_hook("w", -2.0)


def _hooks_pruned(c: HookCase, g) -> None:
    """inputs=[k, w] on (k.tanh() + b).sum() with k = x.sin() * b, b = w.exp()."""
    import torch

    x = c.leaf("x", g, (3,), grad=True)
    w = c.leaf("w", g, (3,))
    v = c.leaf("v", g, (3,), grad=True)
    a = c.add("a", x.sin())
    b = c.add("b", w.exp())
    k = c.add("k", a * b)
    c.add("m", v * 2)                                  # not used by the output
    c.output = c.add("out", (k.tanh() + b).sum())
    c.grad_output = torch.randn((), generator=g, dtype=torch.float64)
    c.inputs = [k, w]
    c.tensor_hook("a", 2.0)
    c.pre("a")
    c.tensor_hook("k")
    c.pre("k", 2.0)
    c.post("k")
    c.tensor_hook("b")
    c.post_acc("x")
    c.tensor_hook("x")
    c.post_acc("w")
    c.tensor_hook("m")
    c.post_acc("v")


def _hooks_random(n_ops: int, with_inputs: bool):
    def build(c: HookCase, g) -> None:
        import torch

        n = ri(g, 1, 4)
        leaves = [c.leaf(f"x{i}", g, (n,), grad=ri(g, 0, 2) == 0) for i in range(ri(g, 2, 4))]
        const = torch.randn(n, generator=g, dtype=torch.float64)
        pool = list(leaves)

        def pick():
            if ri(g, 0, 2) == 0:
                return pool[ri(g, 0, len(pool) - 1)]
            return pool[max(0, len(pool) - 1 - ri(g, 0, 3))]

        pairs = []                                     # the two outputs of each split
        for _ in range(n_ops):
            kind, a, b = ri(g, 0, 6), pick(), pick()
            if kind == 0:
                new = [a * b]
            elif kind == 1:
                new = [a + b]
            elif kind == 2:
                new = [a.tanh()]
            elif kind == 3:
                new = [a.sin() * a]
            elif kind == 4:
                new = [a * const]                      # a None edge
            elif kind == 5:
                new = list(a.repeat(2).split(n))       # one node, two outputs
            else:
                new = [a * a]                          # two equal edges
            for t in new:
                pool.append(c.add(f"t{len(c.tensors) - len(leaves)}", t))
            if len(new) == 2:
                pairs.append(list(c.tensors)[-2:])
        c.output = c.add("out", pool[-1].sum() if ri(g, 0, 1) else pool[-1])
        c.grad_output = torch.randn(c.output.shape, generator=g, dtype=torch.float64)

        # hooks, a third of them on a few tensors (several on one node, both outputs of a split)
        names = list(c.tensors)
        inner = [k for k in names if c.tensors[k].grad_fn is not None]
        focus = pairs[ri(g, 0, len(pairs) - 1)] if pairs else []
        focus += [names[ri(g, 0, len(names) - 1)] for _ in range(3 - len(focus))]
        for _ in range(ri(g, 8, 20)):
            kind = ri(g, 0, 5)
            name = focus[ri(g, 0, 2)] if ri(g, 0, 2) == 0 else names[ri(g, 0, len(names) - 1)]
            scale = (None, None, 2.0, -0.5)[ri(g, 0, 3)]
            leaf = c.tensors[name].grad_fn is None
            if kind == 1:
                c.retain(name if not leaf else inner[ri(g, 0, len(inner) - 1)])
            elif kind == 2:
                c.pre(name, scale)
            elif kind == 3:
                c.post(name, None if leaf else scale)
            elif kind == 4:
                c.post_acc(f"x{ri(g, 0, len(leaves) - 1)}")
            else:
                c.tensor_hook(name, scale)
        if with_inputs:
            reach = set(c.nodes())
            ok = [k for k in names[:-1]
                  if torch.autograd.graph.get_gradient_edge(c.tensors[k]).node in reach]
            chosen = [k for k in ok if ri(g, 0, 2) == 0] or ok[:1]
            c.inputs = [c.tensors[k] for k in chosen]
    return build


def _hooks_root_of_split(c: HookCase, g) -> None:
    """The root is output 1 of a split; a 0-d leaf broadcast; hooks on the root itself."""
    import torch

    x = c.leaf("x", g, (3,))
    s = c.leaf("s", g, (), grad=True)
    p, q = torch.cat([x * 2, s * x]).split(3)
    c.add("p", p)
    c.output = c.add("q", q)
    c.grad_output = torch.randn(3, generator=g, dtype=torch.float64)
    c.tensor_hook("q", -1.0)
    c.retain("q")
    c.tensor_hook("p")
    c.pre("q")
    c.tensor_hook("s", 3.0)
    c.post_acc("s")
    c.post("s")


def _hooks_leaf_twice(c: HookCase, g) -> None:
    """x * x and a constant factor: one AccumulateGrad firing for two edges, a None edge."""
    import torch

    x = c.leaf("x", g, (4,), grad=True)
    k = torch.randn(4, generator=g, dtype=torch.float64)
    h = c.add("h", x * x)
    c.add("m", h * k)
    c.output = c.add("out", c.tensors["m"].sum())
    c.grad_output = torch.randn((), generator=g, dtype=torch.float64)
    c.post("m", 2.0)
    c.pre("m")
    c.tensor_hook("h")
    c.post_acc("x")
    c.tensor_hook("x", 0.5)
    c.pre("x")
    c.retain("h")


def hook_cases(name: str, seed: int) -> list:
    """The cases check ``name`` of ``autograd.hooks`` runs, in order: ``(build, case seed,
    where)``; ``build(HookCase(), torch.Generator().manual_seed(case seed))`` builds one."""
    if name == "one_node":
        return [(_hooks_one_node, seed + 20,
                 "(h.sin() * h).sum() with h = x * w, x with an existing .grad, hooks on h, its "
                 "MulBackward0, x and x's AccumulateGrad")]
    if name == "across_nodes":
        return [(_hooks_branches, seed + 21,
                 "p * q.exp() with p, q, r = torch.cat([a2, b2, a2]).split(2) (r unused), "
                 "a2 = x.sin() * x, b2 = w.tanh() * w")]
    if name == "inputs_prune":
        return [(_hooks_pruned, seed + 22,
                 "(k.tanh() + b).sum() with k = x.sin() * b, b = w.exp(), inputs=[k, w]")]
    if name == "random_graphs":
        g, cases = generator(seed, 23), []
        for i in range(10):
            n_ops, with_inputs = ri(g, 4, 18), i % 2 == 1
            case_seed = ri(g, 0, 2**31 - 2)
            cases.append((_hooks_random(n_ops, with_inputs), case_seed,
                          f"random graph #{i} (seed {seed}; {n_ops} ops"
                          f"{', with inputs=' if with_inputs else ''})"))
        return cases
    if name == "edge_cases":
        return [(_hooks_root_of_split, seed + 24,
                 "q, the second output of torch.cat([x * 2, s * x]).split(3), with a 0-d leaf "
                 "s"),
                (_hooks_leaf_twice, seed + 25, "((x * x) * k).sum() with a constant k")]
    raise ValueError(f"no hooks check {name!r}")


def hook_case(build, case_seed: int) -> HookCase:
    """A :class:`HookCase` built by ``build`` from ``case_seed``."""
    import torch

    c = HookCase()
    build(c, torch.Generator().manual_seed(case_seed))
    return c


@probe
def hook_runs(backward_with_hooks, name: str, seed: int) -> list:
    """``backward_with_hooks(output, grad_output, hooks, inputs)`` on each case of
    :func:`hook_cases` ``(name, seed)``, in order, up to the first where the answer raised.
    Returns one dict per case: ``"used_engine"`` (whether a node of the graph ran by torch's
    engine while the answer ran), ``"events"``: the hook calls :class:`HookCase` recorded, in
    order, ``"grads"``: ``[name, .grad]`` of every tensor of the case after the call
    (:func:`_hook_snap`), or ``"raised"`` (a record) instead of ``"grads"``."""
    import warnings

    out = []
    for build, case_seed, _ in hook_cases(name, seed):
        c = hook_case(build, case_seed)
        used = []
        handles = [n.register_prehook(lambda grads: used.append(True)) for n in c.nodes()]
        got: dict = {}
        try:
            with warnings.catch_warnings():  # reading a non-leaf's .grad, as an answer must
                warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor "
                                        "that is not a leaf Tensor is being accessed")
                backward_with_hooks(c.output, c.grad_output, list(c.hooks),
                                    None if c.inputs is None else list(c.inputs))
        except Exception as exc:
            got["raised"] = raised(exc)
        finally:
            for h in handles:
                h.remove()
        got["used_engine"], got["events"] = bool(used), c.events
        if "raised" not in got:
            got["grads"] = [[k, _hook_grad(t)] for k, t in c.tensors.items()]
        out.append(got)
        if "raised" in got:
            break
    return out
