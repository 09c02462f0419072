"""dispatcher.op-trace: plausible wrong tracing modes fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks import run_checks
from tests.conftest import assert_rejected, load_answer
from tests.labs._liars import LyingStr

EX = "dispatcher.op-trace"


# ------------------------------------------------------------------ plausible wrong answers
class _Base(TorchDispatchMode):
    """Records (what, node name) and runs func; subclasses change one thing."""

    def __init__(self):
        super().__init__()
        self.ops, self.nodes = [], []

    def record(self, func):
        return func

    def node_name(self, node):
        return None if node is None else node.name()

    def run(self, func, args, kwargs):
        return func(*args, **kwargs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.wanted(func):
            self.ops.append(self.record(func))
            self.nodes.append(self.node_name(torch._C._current_autograd_node()))
        return self.run(func, args, kwargs or {})

    def wanted(self, func):
        return True


class Packets(_Base):
    """Records func.overloadpacket (aten.mm) instead of the overload (aten.mm.default)."""

    def record(self, func):
        return func.overloadpacket


class Names(_Base):
    """Records str(func) instead of the OpOverload."""

    def record(self, func):
        return str(func)


class ForwardOnly(_Base):
    """Skips calls made with grad mode off, i.e. everything the backward pass runs."""

    def wanted(self, func):
        return torch.is_grad_enabled()


class DropsKwargs(_Base):
    """Calls func(*args): dtype=, alpha=, ... are lost."""

    def run(self, func, args, kwargs):
        return func(*args)


class DisablesDispatch(_Base):
    """Runs func with torch dispatch disabled 'to avoid recursion': modes below see nothing."""

    def run(self, func, args, kwargs):
        with torch._C._DisableTorchDispatch():
            return func(*args, **kwargs)


class TypeNames(_Base):
    """Records type(node).__name__ ('AccumulateGrad') instead of node.name()."""

    def node_name(self, node):
        return None if node is None else type(node).__name__


class NoNodes(_Base):
    """Leaves `nodes` as None everywhere."""

    def node_name(self, node):
        return None


class HoldsTensors(_Base):
    """Keeps the arguments and results it sees (changes what AccumulateGrad does)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def run(self, func, args, kwargs):
        out = func(*args, **kwargs)
        self.seen.append((args, out))
        return out


class Dedups(_Base):
    """Records each overload once."""

    def wanted(self, func):
        return func not in self.ops


class SharedLists(TorchDispatchMode):
    """Keeps its lists on the class: every instance appends to the same two lists."""

    ops, nodes = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        self.ops.append(func)
        self.nodes.append(None if node is None else node.name())
        return func(*args, **(kwargs or {}))


class FunctionMode(TorchFunctionMode):
    """A TorchFunctionMode: sees torch API calls, not aten overloads."""

    def __init__(self):
        super().__init__()
        self.ops, self.nodes = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        self.nodes.append(None)
        return func(*args, **(kwargs or {}))


WRONG = {
    "records OverloadPackets": (Packets, "OpOverloadPacket"),
    "records names": (Names, "OpOverload object"),
    "records only the forward pass": (ForwardOnly, "backward pass"),
    "drops keyword arguments": (DropsKwargs, "func(*args, **kwargs)"),
    "disables torch dispatch around func": (DisablesDispatch, "_DisableTorchDispatch"),
    "node type names instead of name()": (TypeNames, "name()"),
    "no nodes": (NoNodes, "_current_autograd_node"),
    "records each overload once": (Dedups, "repeats"),
    "a TorchFunctionMode": (FunctionMode, "TorchDispatchMode"),
    "lists shared by every instance": (SharedLists, "shared by every instance"),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", list(WRONG))
def test_plausible_wrong_answers_fail(name, seed):
    answer, phrase = WRONG[name]
    assert_rejected(EX, answer, phrase, seed=seed)


class PairsMadeOnEnter(TorchDispatchMode):
    """Another design the contract allows: (op, node) pairs kept in one list made by __enter__,
    with `ops` and `nodes` as read-only views of it."""

    def __enter__(self):
        self.calls = []
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        self.calls.append((func, node and node.name()))
        return func(*args, **(kwargs or {}))

    @property
    def ops(self):
        return [op for op, _ in self.calls]

    @property
    def nodes(self):
        return [node for _, node in self.calls]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_and_another_design_pass(seed):
    for answer in (load_answer(EX), PairsMadeOnEnter):
        v = run_checks(EX, answer, seed=seed, hidden=True)
        assert v.status == "passed", v.message


def test_holding_tensors_is_caught_and_explained():
    """A mode that keeps tensors alive changes AccumulateGrad's ops on .backward()."""
    v = run_checks(EX, HoldsTensors, seed=0, hidden=True)
    assert v.status == "failed" and "references to tensors" in v.message, v.message


# ------------------------------------------------------------------ lying answers
class AnyNodeName(_Base):
    """Doesn't work out the node: records a str subclass that claims to equal any name (and None)."""

    def node_name(self, node):
        return LyingStr("SomeBackward0")


class _Follows(list):
    """An empty list that claims to be as long as another list."""

    def __init__(self, other):
        super().__init__()
        self.other = other

    def __len__(self):
        return len(self.other)


class NodesClaimingLength(_Base):
    """Records no nodes at all; `nodes` claims to have as many entries as `ops`."""

    def __init__(self):
        super().__init__()
        self.nodes = _Follows(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


LYING = {
    "node names that equal anything": (AnyNodeName, "subclass of str"),
    "an empty nodes list that claims the length of ops": (NodesClaimingLength, "subclass of list"),
}


def test_lying_answers_would_fool_a_naive_comparison():
    x = torch.randn(3, requires_grad=True)
    with AnyNodeName() as liar, NodesClaimingLength() as hider:
        torch.autograd.grad(x.sin().sum(), x)
    assert liar.nodes[0] == None and liar.nodes[-1] == "SinBackward0"  # noqa: E711
    assert len(hider.nodes) == len(hider.ops) > 0 and list(zip(hider.nodes, hider.ops)) == []


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("name", list(LYING))
def test_lying_answers_are_refused_for_their_type(name, seed):
    answer, phrase = LYING[name]
    assert_rejected(EX, answer, phrase, seed=seed)
