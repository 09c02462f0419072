"""compile.recompiles: wrong predictions and compile_once functions that recompile (or never
compile) fail, called directly through run_checks.
The reference and the stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch

from labs.compile import programs
from tests.conftest import assert_rejected

EX = "compile.recompiles"

def _once(fn, backend):
    return torch.compile(fn, backend=backend, dynamic=True)


def _answer(predicted=None, compile_once=_once):
    from tests.conftest import load_answer

    return {"predicted": predicted or load_answer(EX)["predicted"], "compile_once": compile_once}


def _model(zero_one_sizes=True, zero_one_ints=False, symbolic_bools=False, memory=True):
    """A model of the cache like the reference's, with one rule changed: sizes 0 and 1
    specialized or not, ints 0/1 specialized or not, bools made symbolic or not, automatic
    dynamic remembering what changed across compiles or only for the next one."""
    def small(n) -> bool:
        return n < 2 and not isinstance(n, bool)

    def predicted(calls):
        entries, dims, scalar, last = [], set(), False, None
        for x, scale in calls:
            dims |= set(getattr(x, "_dynamo_dynamic_indices", ()))

            def accepts(entry):
                dtype, sizes, guard = entry
                if x.dtype != dtype or x.dim() != len(sizes):
                    return False
                for n, want in zip(x.shape, sizes):
                    if (want is None and zero_one_sizes and n < 2) or want not in (None, n):
                        return False
                if isinstance(guard, type):
                    return type(scale) is guard and not (zero_one_ints and small(scale))
                return type(scale) is type(guard) and scale == guard

            if any(accepts(e) for e in entries):
                continue
            if not memory:
                dims, scalar = set(getattr(x, "_dynamo_dynamic_indices", ())), False
            if last is not None:
                dims |= {d for d, (a, b) in enumerate(zip(last[0], x.shape)) if a != b}
                scalar |= (type(scale) is type(last[1]) and scale != last[1]
                           and (symbolic_bools or not isinstance(scale, bool)))
            sizes = tuple(None if d in dims and (n >= 2 or not zero_one_sizes) else n
                          for d, n in enumerate(x.shape))
            symbolic = scalar and (symbolic_bools or not isinstance(scale, bool)) and not (
                zero_one_ints and small(scale))
            entries.append((x.dtype, sizes, type(scale) if symbolic else scale))
            last = (tuple(x.shape), scale)
        return len(entries)

    return predicted


def _counted(calls):
    """Runs the compiler to count: not a prediction."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(programs.scaled_sum, backend=counter)
    for args in calls:
        compiled(*args)
    return counter.frame_count


def _counted_then_cleared(calls):
    """Counts, then clears Dynamo's counters and caches: the check counts frames its own way."""
    frames = _counted(calls)
    torch._dynamo.utils.counters.clear()
    torch._dynamo.reset()
    return frames


def _counted_unseen(calls):
    """Counts with Dynamo's frame compiler swapped for a function of the answer's own."""
    from torch._dynamo import convert_frame

    original = convert_frame._compile
    convert_frame._compile = lambda *a, **k: original(*a, **k)
    return _counted(calls)  # (and leaves it swapped)


def test_the_model_written_here_passes():
    from grader.checks import run_checks

    for seed in (0, 5):
        v = run_checks(EX, _answer(_model()), seed=seed)
        assert v.status == "passed", v.message


@pytest.mark.parametrize("predicted, phrase, seed", [
    (lambda calls: 1, "6 prediction(s) of 8 are not right", 0),
    (_model(zero_one_sizes=False), "'a batch of one later' (you said 2", 0),
    (_model(symbolic_bools=True), "hidden check", 0),
    (lambda calls: True, "returned a bool, not an int", 0),
    (_counted, "made Dynamo compile 2 frame(s): it ran torch.compile to count", 0),
    (_counted_then_cleared, "made Dynamo compile 2 frame(s): it ran torch.compile to count", 0),
    (_counted_unseen, "put something else in place of Dynamo's frame compiler", 0),
    (_model(zero_one_ints=True), "are not right", 2),
    (_model(memory=False), "hidden check", 1),
])
def test_wrong_predictions_fail(predicted, phrase, seed):
    assert_rejected(EX, _answer(predicted), phrase, seed=seed)


def test_a_table_of_the_public_counts_fails_on_hidden_sequences():
    """The lab's first edition asked for the public sequences' counts as a dict: a table of
    them (typed in, or counted in an earlier cell) predicts nothing."""
    from labs.compile.programs import call_sequences

    counts = {name: _counted(calls) for name, calls in call_sequences().items()}
    table = {tuple((tuple(x.shape), x.dtype, s) for x, s in calls): n
             for calls, n in zip(call_sequences().values(), counts.values())}

    def looked_up(calls):
        return table.get(tuple((tuple(x.shape), x.dtype, s) for x, s in calls), 1)

    v = assert_rejected(EX, _answer(looked_up), "random sequence")
    assert v.passed >= 1, v.message


@pytest.mark.parametrize("compile_once, phrase", [
    (lambda fn, backend: torch.compile(fn, backend=backend), "compiled 2 frames, not 1"),
    (lambda fn, backend: torch.compile(fn, backend=backend, dynamic=False), "compiled 4 frames"),
    (lambda fn, backend: torch.compile(fn, backend="eager", dynamic=True),
     "use the backend you are given"),
    (lambda fn, backend: fn, "use the backend you are given"),
    (lambda fn, backend: torch.compile(lambda *a: fn(*a) + 1, backend=backend, dynamic=True),
     "different value from eager"),
])
def test_wrong_compile_once_fails(compile_once, phrase):
    assert_rejected(EX, _answer(compile_once=compile_once), phrase)


def test_compile_once_that_marks_only_the_first_dim_fails_on_hidden_sequences():
    def mark_batch(fn, backend):
        compiled = torch.compile(fn, backend=backend)

        def run(*args):
            for a in args:
                if isinstance(a, torch.Tensor):
                    torch._dynamo.mark_dynamic(a, 0)
            return compiled(*args)

        return run

    v = assert_rejected(EX, _answer(compile_once=mark_batch), "frames, not 1")
    assert v.passed >= 1


def test_a_missing_key_is_named():
    assert_rejected(EX, {"predicted": _model()}, "no 'compile_once'")


def test_a_global_recompile_limit_of_one_fails():
    """Dynamo stops recompiling: one frame counted, later calls run eagerly with eager's
    outputs, and every other compiled function of the process is limited too."""
    def limited(fn, backend):
        torch._dynamo.config.recompile_limit = 1
        return torch.compile(fn, backend=backend)

    before = torch._dynamo.config.recompile_limit
    assert_rejected(EX, _answer(compile_once=limited), "changed torch._dynamo.config "
                                                       "(['recompile_limit'])")
    assert torch._dynamo.config.recompile_limit == before  # (the probe gave it back)


def test_a_recompile_limit_patched_around_each_call_fails():
    """The config is back after every call, but the calls past the first guard failure ran
    eagerly."""
    def limited(fn, backend):
        return torch._dynamo.config.patch(recompile_limit=1)(torch.compile(fn, backend=backend))

    assert_rejected(EX, _answer(compile_once=limited), "calls ran no compiled graph")
