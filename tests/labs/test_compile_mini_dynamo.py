"""compile.mini-dynamo: plausible wrong answers fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import dis

import torch
from torch import fx

import labs.compile.checks.mini_dynamo  # noqa: F401  (registers the checks)
from tests.conftest import assert_rejected

EX = "compile.mini-dynamo"


class Eager:
    """Runs fn itself (and keeps a symbolic_trace graph so .graphs looks right)."""

    def __init__(self, fn):
        self.fn, self.graphs, self.seen = fn, [], set()

    def __call__(self, *args):
        key = tuple((a.shape, a.dtype) for a in args)
        if key not in self.seen:
            self.seen.add(key)
            self.graphs.append(fx.GraphModule(torch.nn.Module(), fx.Graph()))
        return self.fn(*args)


class SymbolicTrace:
    """torch.fx.symbolic_trace: runs fn's code with proxies (not bytecode)."""

    def __init__(self, fn):
        self.fn, self.graphs, self.cache = fn, [], {}

    def __call__(self, *args):
        key = tuple((a.shape, a.dtype) for a in args)
        if key not in self.cache:
            self.cache[key] = fx.symbolic_trace(self.fn)
            self.graphs.append(self.cache[key])
        return self.cache[key](*args)


class ViaDynamo:
    """torch.compile with a backend that keeps each graph: Dynamo does the work."""

    def __init__(self, fn):
        self.graphs = []

        def backend(gm, example_inputs):
            self.graphs.append(gm)
            return gm.forward

        self.compiled = torch.compile(fn, backend=backend, dynamic=False)

    def __call__(self, *args):
        return self.compiled(*args)


def _with_guard(reference, guard):
    class Answer(reference):
        def __call__(self, *args):
            key = guard(args)
            if key not in self.cache:
                self.cache[key] = self.trace(len(args))
                self.graphs.append(self.cache[key])
            return self.cache[key](*args)

    return Answer


def test_running_fn_eagerly_is_refused():
    assert_rejected(EX, Eager, "programs.sin_plus's code ran")


def test_symbolic_trace_is_refused():
    assert_rejected(EX, SymbolicTrace, "your answer ran torch/fx/_symbolic_trace.py")


class TracedCopy(SymbolicTrace):
    """symbolic_trace of a copy of fn's code object (a new object, the same body)."""

    def __init__(self, fn):
        import types

        super().__init__(types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__,
                                            fn.__defaults__, fn.__closure__))


class TracedInAThread(SymbolicTrace):
    """symbolic_trace in a thread of the answer's own."""

    def __call__(self, *args):
        import threading

        key = tuple((a.shape, a.dtype) for a in args)
        if key not in self.cache:
            worker = threading.Thread(
                target=lambda: self.cache.setdefault(key, fx.symbolic_trace(self.fn)))
            worker.start()
            worker.join()
            self.graphs.append(self.cache[key])
        return self.cache[key](*args)


class TracedUnwatched(SymbolicTrace):
    """symbolic_trace with the profiler switched off around it."""

    def __call__(self, *args):
        import sys

        watching = sys.getprofile()
        sys.setprofile(None)
        try:
            return super().__call__(*args)
        finally:
            sys.setprofile(watching)


def test_tracing_a_copy_of_fn_in_a_thread_or_unwatched_is_refused():
    assert_rejected(EX, TracedCopy, "your answer ran torch/fx/_symbolic_trace.py")
    assert_rejected(EX, TracedInAThread, "your answer ran torch/fx/_symbolic_trace.py")
    assert_rejected(EX, TracedUnwatched, "switched off or went around the profiler")


def test_dynamo_is_refused():
    v = assert_rejected(EX, ViaDynamo)
    assert "torch._dynamo compiled a frame" in v.message or "code ran" in v.message \
        or "your answer ran torch/_dynamo/convert_frame.py" in v.message, v.message


class ViaDynamoUncounted(ViaDynamo):
    """ViaDynamo, with the check's frame counter swapped out for Dynamo's own _compile."""

    def __call__(self, *args):
        from torch._dynamo import convert_frame

        counted = convert_frame._compile
        convert_frame._compile = counted.__closure__[0].cell_contents._original
        try:
            return super().__call__(*args)
        finally:
            convert_frame._compile = counted


def test_dynamo_hidden_from_the_frame_count_is_refused():
    assert_rejected(EX, ViaDynamoUncounted, "your answer ran torch/_dynamo/convert_frame.py")


def test_no_guard_is_refused(reference):
    assert_rejected(EX, _with_guard(reference(EX), lambda args: len(args)),
                    "must trace once more")


def test_a_guard_without_dtype_is_refused(reference):
    v = assert_rejected(EX, _with_guard(reference(EX), lambda args: tuple(a.shape for a in args)),
                        "must trace once more")
    assert "float64" in v.message


def test_a_guard_on_the_first_inputs_dtype_only_is_refused(reference):
    def guard(args):
        return tuple(a.shape for a in args), args[0].dtype

    v = assert_rejected(EX, _with_guard(reference(EX), guard), "must trace once more")
    assert "only the last input in float64" in v.message, v.message


def test_tracing_on_every_call_is_refused(reference):
    class NoCache(reference(EX)):
        def __call__(self, *args):
            self.graphs.append(self.trace(len(args)))
            return self.graphs[-1](*args)

    assert_rejected(EX, NoCache, "must reuse the cached graph")


def test_skipping_unknown_opcodes_is_refused(reference):
    """Drops every instruction it does not know (COMPARE_OP, the jump): branchy becomes x * 2."""
    ref = reference(EX)

    class Skipping(ref):
        def trace(self, nargs):
            code = self.fn.__code__
            keep = ("RESUME", "LOAD_FAST", "LOAD_CONST", "LOAD_METHOD", "LOAD_ATTR", "PRECALL",
                    "CALL", "BINARY_OP", "RETURN_VALUE", "STORE_FAST", "LOAD_GLOBAL",
                    "KW_NAMES", "BUILD_TUPLE", "UNARY_NEGATIVE", "PUSH_NULL")
            ins = [i for i in dis.get_instructions(code) if i.opname in keep]
            real = dis.get_instructions
            dis.get_instructions = lambda c: iter(ins)
            try:
                return ref.trace(self, nargs)
            finally:
                dis.get_instructions = real

    assert_rejected(EX, Skipping, "never be skipped")


def test_swapped_binary_operands_are_refused(reference):
    """Pops BINARY_OP's operands in the wrong order: a - b becomes b - a."""
    ref = reference(EX)

    class Swapped(ref):
        def trace(self, nargs):
            ops = ref.trace.__globals__["BINARY_OPS"]
            saved = dict(ops)
            ops.update({k: _swapped(f) for k, f in saved.items()})
            try:
                return ref.trace(self, nargs)
            finally:
                ops.update(saved)

    assert_rejected(EX, Swapped, "order of operands")


def _swapped(f):
    return lambda a, b: f(b, a)


def test_a_function_instead_of_a_class_is_refused():
    assert_rejected(EX, lambda fn: fn, "define it as a class")
