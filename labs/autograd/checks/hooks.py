"""Checks of ``autograd.hooks``: the learner's ``backward_with_hooks(output, grad_output, hooks,
inputs=None)`` against torch's engine running the same graph with the same hooks registered.

Each case is built twice from one seed. The answer gets one copy, with the hooks as data:
``(kind, target, fn)`` triples in registration order. The other copy gets the same hooks really
registered (``Tensor.register_hook``, ``Tensor.retain_grad``, ``Node.register_prehook``,
``Node.register_hook``, ``Tensor.register_post_accumulate_grad_hook``) and runs
``torch.autograd.backward(output, grad_output, inputs=inputs)``. Every hook records its calls
(which hook, its arguments, and, for tensor and post-accumulate-grad hooks, the ``.grad`` of its
tensor at that moment); the two traces are compared, then the ``.grad`` of every tensor of the
case. Torch's engine is off while the answer runs: a pre-hook on every node of the answer's copy
would see torch's engine run one.

Not compared, because the engine does not guarantee it: the order among ``AccumulateGrad`` nodes
that one node made ready together (they share a sequence number, and ``ReadyQueue``'s heap
decides). Each such node's own hook calls are still compared in order.
"""
from __future__ import annotations

import warnings

from grader.checks import CheckFailure, check, exact, plain_tensor
from labs.autograd.checks.graph_walk import _ri

EXERCISE = "autograd.hooks"
_NA = "n/a"   # the "own .grad" of an event of a Node hook (it has no tensor of its own)

_ORDER = ("On one node the engine runs: its tensor hooks (each tensor's hooks together, the "
          "tensors in the order they got their first hook), then retain_grad, then the node's "
          "pre-hooks, then the node (AccumulateGrad: .grad is updated, then the "
          "post-accumulate-grad hooks run), then its post-hooks (torch/csrc/autograd/engine.cpp: "
          "call_function, call_tensor_pre_hooks; node.h: NOTE [Hooks ordering]).")
_RETURNS = ("A hook that returns a value replaces what comes after it: a tensor hook's value "
            "replaces that tensor's gradient (for its later hooks, retain_grad and the node), a "
            "pre-hook's tuple the node's inputs, a post-hook's tuple the node's results, which "
            "the next nodes then receive. Post-hooks are called as hook(grad_inputs, "
            "grad_outputs): what the node returned (fitted by validate_outputs) and what it was "
            "given (after the pre-hooks).")


# --------------------------------------------------------------------------- a case


class _Case:
    """One graph with names for its tensors and the hooks to register on it, each recording its
    calls in ``events`` as ``(hook index, arguments, own .grad)``."""

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
        t, i = self.tensors[name], len(self.hooks)

        def fn(grad):
            self.events.append((i, (_snap(grad, f"the gradient passed to {self.about[i]}"),),
                                _grad_of(t, self.about[i])))
            return None if scale is None or grad is None else grad * scale
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
            self.events.append((i, (_snap_tuple(grad_outputs, f"the grad_outputs passed to "
                                                 f"{self.about[i]}"),), _NA))
            return _times(grad_outputs, scale)
        self._hook("pre", node, fn, f"{path}.register_prehook(fn){self._scaled(scale)}", where)

    def post(self, name, scale=None):
        """``node.register_hook(fn)`` on the node of ``name``."""
        node, where, path = self.node(name)
        i = len(self.hooks)

        def fn(grad_inputs, grad_outputs):
            what = f"passed to {self.about[i]}"
            self.events.append((i, (_snap_tuple(grad_inputs, f"the grad_inputs {what}"),
                                    _snap_tuple(grad_outputs, f"the grad_outputs {what}")), _NA))
            return _times(grad_inputs, scale)
        self._hook("post", node, fn, f"{path}.register_hook(fn){self._scaled(scale)}", where)

    def post_acc(self, name):
        """``leaf.register_post_accumulate_grad_hook(fn)``."""
        t, i = self.tensors[name], len(self.hooks)

        def fn(tensor):
            if tensor is not t:
                raise CheckFailure(
                    f"{self.about[i]} was called with a {type(tensor).__name__} that is not "
                    f"{name}: a post-accumulate-grad hook gets the leaf tensor itself "
                    "(AccumulateGrad.variable), whose .grad it can read.")
            self.events.append((i, (), _grad_of(t, self.about[i])))
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


def _times(grads, scale):
    """A hook's return value: each gradient times ``scale`` (None stays None), or None."""
    if scale is None or not grads:
        return None
    return tuple(None if g is None else g * scale for g in grads)


def _snap(value, what):
    """A detached copy of a gradient argument (a plain tensor or None)."""
    if value is None:
        return None
    if not hasattr(value, "detach"):
        raise CheckFailure(f"{what} is a {type(value).__name__}; torch passes a tensor (or None "
                           "for a slot that received no gradient).")
    return plain_tensor(value, what).detach().clone()


def _snap_tuple(value, what):
    exact(value, tuple, what)
    return tuple(_snap(v, f"item {k} of {what}") for k, v in enumerate(value))


def _grad_of(t, about):
    """A copy of ``t.grad`` now (None if unset), read without the non-leaf warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = t.grad
    return _snap(g, f".grad of the tensor of {about}")


# --------------------------------------------------------------------------- comparing


def _differs(mine, theirs, verb="passes") -> str:
    """How ``mine`` differs from torch's ``theirs`` (snapshots), in words; "" if it does not."""
    import torch

    if theirs is None or mine is None:
        if (theirs is None) == (mine is None):
            return ""
        return (f"None where torch {verb} a tensor" if mine is None
                else f"a tensor where torch {verb} None")
    if isinstance(theirs, tuple):
        if len(mine) != len(theirs):
            return f"a tuple of {len(mine)} where torch {verb} {len(theirs)}"
        for k, (a, b) in enumerate(zip(mine, theirs)):
            why = _differs(a, b, verb)
            if why:
                return f"{why} (item {k})"
        return ""
    if mine.shape != theirs.shape:
        return f"shape {tuple(mine.shape)} where torch's is {tuple(theirs.shape)}"
    if mine.dtype != theirs.dtype:
        return f"dtype {mine.dtype} where torch's is {theirs.dtype}"
    if not torch.allclose(mine, theirs, rtol=1e-6, atol=1e-9):
        return f"values that differ from torch's by up to {(mine - theirs).abs().max().item():.3g}"
    return ""


def _state(g) -> str:
    return "None" if g is None else "set"


def _canonical(events, case, ties) -> list:
    """``events`` with each run of back-to-back firings of tied AccumulateGrad nodes (``ties``:
    node name -> group) sorted by node name, each firing's own calls kept in order."""
    out, k = [], 0
    while k < len(events):
        group = ties.get(case.node_of[events[k][0]])
        j = k + 1
        while group is not None and j < len(events) and \
                ties.get(case.node_of[events[j][0]]) == group:
            j += 1
        firings = []
        for e in events[k:j]:
            if firings and case.node_of[firings[-1][-1][0]] == case.node_of[e[0]]:
                firings[-1].append(e)
            else:
                firings.append([e])
        names = [case.node_of[f[0][0]] for f in firings]
        if len(set(names)) == len(names):
            firings.sort(key=lambda f: case.node_of[f[0][0]])
        out.extend(e for f in firings for e in f)
        k = j
    return out


def _ties(order, case) -> dict:
    """Node name -> group for the AccumulateGrad nodes torch ran back to back (made ready by
    one node: they share the top sequence number)."""
    ties, run = {}, []
    for node in [*order, None]:
        if node is not None and hasattr(node, "variable"):
            run.append(node)
            continue
        if len(run) > 1:
            for n in run:
                if n in case.node_names:
                    ties[case.node_names[n]] = id(run[0])
        run = []
    return ties


def _pruned(name, ran, inputs) -> str:
    if name in ran:
        return ""
    if inputs is not None:
        return (f" Torch never runs {name}: with inputs=, only the nodes from which the node of "
                "an input can be reached run (GraphTask::init_to_execute marks them needed); "
                "the hooks of the others never fire.")
    return f" Torch never runs {name}, so its hooks never fire."


def _missing(ib, case, theirs) -> str:
    """Why torch calls hook ``ib`` (which the answer never calls), in words."""
    args = next(e[1] for e in theirs if e[0] == ib)
    if case.hooks[ib][0] == "tensor" and args == (None,):
        return (" Torch calls it with None: its tensor's slot received no gradient, but its "
                "node runs, and call_tensor_pre_hooks calls every tensor hook of the node.")
    return " Every node that runs fires its hooks."


def _compare_traces(mine, theirs, case, ran, where) -> None:
    called = {e[0] for e in mine}
    for k, (a, b) in enumerate(zip(mine, theirs)):
        (ia, args_a, own_a), (ib, args_b, own_b) = a, b
        after = "first" if k == 0 else f"after the same first {k} hook call(s)"
        if ia != ib:
            na, nb = case.node_of[ia], case.node_of[ib]
            if ib not in called:
                raise CheckFailure(f"on {where}, {after}, torch calls {case.about[ib]} (on "
                                   f"{nb}), which yours never calls.{_missing(ib, case, theirs)}")
            if na == nb:
                why = f" Both sit on {na}. {_ORDER}"
            else:
                why = _pruned(na, ran, case.inputs) or (
                    f" Torch runs {nb} before {na}: a node runs when all its gradients have "
                    "arrived, the ready one with the highest _sequence_nr() first (ReadyQueue), "
                    "and its hooks fire when it runs.")
            raise CheckFailure(f"on {where}, {after}, torch calls {case.about[ib]} and yours "
                               f"calls {case.about[ia]}.{why}")
        for n, (x, y) in enumerate(zip(args_a, args_b)):
            why = _differs(x, y)
            if why:
                arg = ("its argument" if len(args_b) == 1 else
                       ("its first argument (grad_inputs)",
                        "its second argument (grad_outputs)")[n])
                rule = _RETURNS
                if case.inputs is not None and n == 0 and len(args_b) == 2:
                    rule = ("With inputs=, a node does not compute the gradients for edges into "
                            "nodes that will not run (the generated nodes ask "
                            "Node::task_should_compute_output): those results are None. "
                            f"{rule}")
                raise CheckFailure(f"on {where}, your engine passed {case.about[ia]} (call "
                                   f"#{k + 1}) {why} in {arg}. {rule}")
        if own_b is not _NA and _differs(own_a, own_b):
            kind = case.hooks[ia][0]
            name = case.name_of(case.hooks[ia][1])
            if kind == "post_accumulate_grad":
                rule = ("AccumulateGrad::apply first updates .grad (adding to what is there), "
                        "then calls the post-accumulate-grad hooks.")
            elif case.hooks[ia][1].grad_fn is None:
                rule = ("A leaf's tensor hooks run before its AccumulateGrad updates .grad (they "
                        "can still change the gradient it adds).")
            else:
                rule = ("retain_grad's hook runs after every tensor hook of the node "
                        "(call_tensor_pre_hooks runs retains_grad_hooks_ last), so .grad gets "
                        "the gradient the hooks returned, whenever retain_grad() was called.")
            yours = _state(own_a) if _state(own_a) != _state(own_b) else "set to other values"
            raise CheckFailure(f"on {where}, when {case.about[ia]} ran, {name}.grad was "
                               f"{_state(own_b)} with torch but {yours} with yours. {rule}")
    if len(mine) < len(theirs):
        ib = theirs[len(mine)][0]
        nb = case.node_of[ib]
        raise CheckFailure(f"on {where}, torch also calls {case.about[ib]} (on {nb}), which "
                           f"yours never calls.{_missing(ib, case, theirs)}")
    if len(mine) > len(theirs):
        ia = mine[len(theirs)][0]
        na = case.node_of[ia]
        if ia in {e[0] for e in theirs}:
            raise CheckFailure(f"on {where}, yours calls {case.about[ia]} (on {na}) more often "
                               "than torch: a node runs once, and its hooks fire once, when it "
                               "runs.")
        raise CheckFailure(f"on {where}, yours calls {case.about[ia]} (on {na}), which torch "
                           f"never calls.{_pruned(na, ran, case.inputs)}")


def _compare_grads(mine: _Case, theirs: _Case, where) -> None:
    for name, t in theirs.tensors.items():
        a = _grad_of(mine.tensors[name], f"{name}")
        b = _grad_of(t, f"{name}")
        why = _differs(a, b, "has")
        if not why:
            continue
        if t.grad_fn is None:
            rule = ("AccumulateGrad adds into an existing .grad; a leaf whose AccumulateGrad "
                    "does not run (unreachable, or pruned by inputs=) keeps its .grad.")
        elif b is None:
            rule = ("Torch leaves .grad of a non-leaf None unless it is retained (retain_grad(), "
                    "or listed in inputs=).")
        else:
            rule = ("A retained non-leaf (retain_grad(), or a non-leaf listed in inputs=: "
                    "torch/csrc/autograd/python_engine.cpp: THPEngine_run_backward calls "
                    "retain_grad on it) gets the gradient its slot received, after the tensor "
                    "hooks of its node.")
        raise CheckFailure(f"on {where}, after backward {name}.grad is {why}. {rule}")


def _verify(backward_with_hooks, build, seed: int, where: str) -> None:
    """Build the case twice from ``seed``; run the answer on one copy and torch on the other."""
    import torch

    mine, theirs = _Case(), _Case()
    build(mine, torch.Generator().manual_seed(seed))
    build(theirs, torch.Generator().manual_seed(seed))

    used_engine = []
    handles = [n.register_prehook(lambda grads: used_engine.append(True)) for n in mine.nodes()]
    engine_msg = (f"on {where}, your backward_with_hooks ran torch's engine (backward(), "
                  "torch.autograd.grad or the like ran a node of the graph). Run the nodes "
                  "yourself with node(*grads), and call the hooks of `hooks` yourself.")
    try:
        with warnings.catch_warnings():  # reading a non-leaf's .grad, as an answer must, warns
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is "
                                    "not a leaf Tensor is being accessed")
            backward_with_hooks(mine.output, mine.grad_output, list(mine.hooks),
                                None if mine.inputs is None else list(mine.inputs))
    except Exception:
        if used_engine:
            raise CheckFailure(engine_msg) from None
        raise
    finally:
        for h in handles:
            h.remove()
    if used_engine:
        raise CheckFailure(engine_msg)

    theirs.register()
    order = []
    for n in theirs.nodes():
        n.register_prehook(lambda grads, n=n: order.append(n))
    torch.autograd.backward(theirs.output, theirs.grad_output, inputs=theirs.inputs)

    ties = _ties(order, theirs)
    ran = {theirs.node_names[n] for n in order if n in theirs.node_names}
    _compare_traces(_canonical(mine.events, mine, ties), _canonical(theirs.events, theirs, ties),
                    theirs, ran, where)
    _compare_grads(mine, theirs, where)


# --------------------------------------------------------------------------- cases


def _one_node(c: _Case, g) -> None:
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


def _branches(c: _Case, g) -> None:
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


def _pruned_case(c: _Case, g) -> None:
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


@check(EXERCISE)
def one_node(backward_with_hooks, ctx):
    """fires every kind of hook on one node in torch's order, with their effects"""
    _verify(backward_with_hooks, _one_node, ctx.seed + 20,
            "(h.sin() * h).sum() with h = x * w, x with an existing .grad, hooks on h, its "
            "MulBackward0, x and x's AccumulateGrad")


@check(EXERCISE)
def across_nodes(backward_with_hooks, ctx):
    """fires hooks node by node in the ready queue's order, a multi-output node included"""
    _verify(backward_with_hooks, _branches, ctx.seed + 21,
            "p * q.exp() with p, q, r = torch.cat([a2, b2, a2]).split(2) (r unused), "
            "a2 = x.sin() * x, b2 = w.tanh() * w")


@check(EXERCISE)
def inputs_prune(backward_with_hooks, ctx):
    """with inputs=, fires only the hooks of nodes that lead to an input"""
    _verify(backward_with_hooks, _pruned_case, ctx.seed + 22,
            "(k.tanh() + b).sum() with k = x.sin() * b, b = w.exp(), inputs=[k, w]")


def _random_case(n_ops: int, with_inputs: bool):
    def build(c: _Case, g) -> None:
        import torch

        n = _ri(g, 1, 4)
        leaves = [c.leaf(f"x{i}", g, (n,), grad=_ri(g, 0, 2) == 0) for i in range(_ri(g, 2, 4))]
        const = torch.randn(n, generator=g, dtype=torch.float64)
        pool = list(leaves)

        def pick():
            if _ri(g, 0, 2) == 0:
                return pool[_ri(g, 0, len(pool) - 1)]
            return pool[max(0, len(pool) - 1 - _ri(g, 0, 3))]

        pairs = []                                     # the two outputs of each split
        for _ in range(n_ops):
            kind, a, b = _ri(g, 0, 6), pick(), pick()
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
        c.output = c.add("out", pool[-1].sum() if _ri(g, 0, 1) else pool[-1])
        c.grad_output = torch.randn(c.output.shape, generator=g, dtype=torch.float64)

        # hooks, a third of them on a few tensors (several on one node, both outputs of a split)
        names = list(c.tensors)
        inner = [k for k in names if c.tensors[k].grad_fn is not None]
        focus = pairs[_ri(g, 0, len(pairs) - 1)] if pairs else []
        focus += [names[_ri(g, 0, len(names) - 1)] for _ in range(3 - len(focus))]
        for _ in range(_ri(g, 8, 20)):
            kind = _ri(g, 0, 5)
            name = focus[_ri(g, 0, 2)] if _ri(g, 0, 2) == 0 else names[_ri(g, 0, len(names) - 1)]
            scale = (None, None, 2.0, -0.5)[_ri(g, 0, 3)]
            leaf = c.tensors[name].grad_fn is None
            if kind == 1:
                c.retain(name if not leaf else inner[_ri(g, 0, len(inner) - 1)])
            elif kind == 2:
                c.pre(name, scale)
            elif kind == 3:
                c.post(name, None if leaf else scale)
            elif kind == 4:
                c.post_acc(f"x{_ri(g, 0, len(leaves) - 1)}")
            else:
                c.tensor_hook(name, scale)
        if with_inputs:
            reach = set(c.nodes())
            ok = [k for k in names[:-1]
                  if torch.autograd.graph.get_gradient_edge(c.tensors[k]).node in reach]
            chosen = [k for k in ok if _ri(g, 0, 2) == 0] or ok[:1]
            c.inputs = [c.tensors[k] for k in chosen]
    return build


@check(EXERCISE, hidden=True)
def random_graphs(backward_with_hooks, ctx):
    """matches torch's hook calls and .grad on seeded random graphs with random hooks"""
    g = ctx.generator(23)
    for i in range(10):
        n_ops, with_inputs = _ri(g, 4, 18), i % 2 == 1
        seed = _ri(g, 0, 2**31 - 2)
        _verify(backward_with_hooks, _random_case(n_ops, with_inputs), seed,
                f"random graph #{i} (seed {ctx.seed}; {n_ops} ops"
                f"{', with inputs=' if with_inputs else ''})")


def _root_of_split(c: _Case, g) -> None:
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


def _leaf_twice(c: _Case, g) -> None:
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


@check(EXERCISE, hidden=True)
def edge_cases(backward_with_hooks, ctx):
    """a root that is an output of a split, a 0-d leaf, x * x, a node with a None edge"""
    _verify(backward_with_hooks, _root_of_split, ctx.seed + 24,
            "q, the second output of torch.cat([x * 2, s * x]).split(3), with a 0-d leaf s")
    _verify(backward_with_hooks, _leaf_twice, ctx.seed + 25,
            "((x * x) * k).sum() with a constant k")
