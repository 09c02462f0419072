"""modules.mini-tracer: plausible wrong tracers fail, called directly through run_checks. Each is
the reference answer (rewritten as a class with one method per rule, so that one rule can be
overridden) with one rule changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import inspect
import operator

import pytest
import torch
from torch import nn

from tests.conftest import assert_rejected

EX = "modules.mini-tracer"


class Proxy:
    def __init__(self, node, tracer):
        self.node, self.tracer = node, tracer

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.tracer.method(self, name, args, kwargs)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        tracer = next(a.tracer for a in Tracer.flatten((args, kwargs)) if isinstance(a, Proxy))
        return tracer.record("call_function", func, args, kwargs or {})

    def __neg__(self):
        return self.tracer.record("call_function", operator.neg, (self,), {})

    def __getitem__(self, key):
        return self.tracer.record("call_function", operator.getitem, (self, key), {})


def _binary(op):
    return (lambda self, other: self.tracer.binary(op, self, other, False),
            lambda self, other: self.tracer.binary(op, self, other, True))


for _name in ("add", "sub", "mul", "truediv", "matmul"):
    _forward, _reflected = _binary(getattr(operator, _name))
    setattr(Proxy, f"__{_name}__", _forward)
    setattr(Proxy, f"__r{_name}__", _reflected)


class Tracer:
    """The reference answer, one method per rule; ``Tracer()`` is the answer (``__call__``)."""

    @staticmethod
    def flatten(value):
        if isinstance(value, (list, tuple)):
            for v in value:
                yield from Tracer.flatten(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from Tracer.flatten(v)
        else:
            yield value

    def arg(self, value):
        if isinstance(value, Proxy):
            return value.node
        if isinstance(value, (list, tuple)):
            return type(value)(self.arg(v) for v in value)
        if isinstance(value, dict):
            return {k: self.arg(v) for k, v in value.items()}
        return value

    def record(self, op, target, args, kwargs):
        return Proxy(self.graph.create_node(op, target, self.arg(tuple(args)),
                                            self.arg(dict(kwargs))), self)

    def binary(self, op, proxy, other, reflected):
        args = (other, proxy) if reflected else (proxy, other)
        return self.record("call_function", op, args, {})

    def method(self, proxy, name, args, kwargs):
        return self.record("call_method", name, (proxy, *args), kwargs)

    def is_leaf(self, module):
        return module.__module__.startswith("torch.nn") and not isinstance(module, nn.Sequential)

    def attribute(self, path):
        if path not in self.attributes:
            self.attributes[path] = self.record("get_attr", path, (), {})
        return self.attributes[path]

    def patched_getattr(self, original):
        def getattr_(module, name):
            value = original(module, name)
            path = self.tensor_paths.get(id(value))
            return self.attribute(path) if path is not None else value

        return getattr_

    def __call__(self, root):
        self.root, self.graph, self.attributes = root, torch.fx.Graph(), {}
        self.paths = {m: path for path, m in root.named_modules()}
        self.tensor_paths = {id(t): path for path, t in
                             [*root.named_parameters(), *root.named_buffers()]}
        original_call, original_getattr = nn.Module.__call__, nn.Module.__getattr__

        def call(module, *args, **kwargs):
            if self.is_leaf(module):
                return self.record("call_module", self.paths[module], args, kwargs)
            return module.forward(*args, **kwargs)

        names = list(inspect.signature(type(root).forward).parameters)[1:]
        inputs = [self.record("placeholder", name, (), {}) for name in names]
        nn.Module.__call__ = call
        nn.Module.__getattr__ = self.patched_getattr(original_getattr)
        try:
            out = type(root).forward(root, *inputs)
        finally:
            nn.Module.__call__, nn.Module.__getattr__ = original_call, original_getattr
        self.graph.output(self.arg(out))
        return self.graph


class NoLeafRule(Tracer):
    def is_leaf(self, module):
        return False


class SequentialIsALeaf(Tracer):
    def is_leaf(self, module):
        return module.__module__.startswith("torch.nn")


class MethodsAsFunctions(Tracer):
    def method(self, proxy, name, args, kwargs):
        return self.record("call_function", getattr(torch, name), (proxy, *args), kwargs)


class ParametersInlined(Tracer):
    def patched_getattr(self, original):
        return original


class AGetAttrPerRead(Tracer):
    def attribute(self, path):
        return self.record("get_attr", path, (), {})


class ReflectedOperandsSwapped(Tracer):
    def binary(self, op, proxy, other, reflected):
        return self.record("call_function", op, (proxy, other), {})


@pytest.mark.parametrize("answer, phrase", [
    (NoLeafRule(), "node 3 of your graph is get_attr s0.weight; symbolic_trace records "
                   "call_module s0 there. modules of torch.nn are leaves"),
    (SequentialIsALeaf(), "node 7 of your graph is call_module s3; symbolic_trace records "
                          "call_module s3.0 there. 's3' is an nn.Sequential"),
    (MethodsAsFunctions(), "is call_function torch.mean; symbolic_trace records call_method "
                           "mean there. A tensor method called on a proxy"),
    (ParametersInlined(), "node 4 of your graph is call_function _operator.mul; symbolic_trace "
                          "records get_attr scale there. A parameter or buffer that forward "
                          "reads (self.scale) is a get_attr node"),
    (AGetAttrPerRead(), "is get_attr scale; symbolic_trace records call_function _operator.mul "
                        "there. A parameter or buffer that forward reads"),
    (ReflectedOperandsSwapped(), "(call_function _operator.sub) has args ['%14', '1.0'] and "
                                 "kwargs {}; symbolic_trace records args ['1.0', '%14']"),
])
def test_wrong_answers_fail_the_public_check(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_a_tracer_that_returns_something_else_than_a_graph_fails():
    assert_rejected(EX, lambda root: list(Tracer()(root).nodes),
                    "trace returned a list; return a torch.fx.Graph")


def test_symbolic_trace_itself_is_refused():
    assert_rejected(EX, lambda root: torch.fx.symbolic_trace(root).graph,
                    "torch/fx/_symbolic_trace.py")
