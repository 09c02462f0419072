"""distributed.collective-cost: plausible wrong cost models fail, called directly through
run_checks. Each is the reference answer with one case changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import math

import pytest

from tests.conftest import assert_rejected, load_answer

EX = "distributed.collective-cost"


@pytest.fixture(scope="module")
def ref():
    return load_answer(EX)


def flawed(ref, flaw):
    """The reference cost model with one flaw."""

    def collective_cost(op, algorithm, nbytes, world_size, alpha, beta):
        sent, seconds = ref(op, algorithm, nbytes, world_size, alpha, beta)
        p, n = world_size, nbytes
        if flaw == "tree time counts messages" and algorithm == "tree":
            messages = (p - 1) * (2 if op == "all_reduce" else 1)
            return sent, messages * (alpha + n * beta)
        if flaw == "ring all-reduce moves n a step" and (op, algorithm) == ("all_reduce", "ring"):
            return sent, 2 * (p - 1) * (alpha + n * beta)
        if flaw == "ring all-reduce sends 2n" and (op, algorithm) == ("all_reduce", "ring"):
            return [2 * n] * p, seconds
        if flaw == "every rank sends in a tree broadcast" and (op, algorithm) == ("broadcast",
                                                                                  "tree"):
            return [n] * p, seconds
        if flaw == "nbytes taken as one rank's input to all-gather" and op == "all_gather":
            return [(p - 1) * n] * p, (p - 1) * (alpha + n * beta)
        if flaw == "log2 without ceil" and algorithm == "tree":
            rounds = math.log2(p) * (2 if op == "all_reduce" else 1)
            return sent, rounds * (alpha + n * beta)
        if flaw == "bytes as floats" and algorithm == "ring" and op != "broadcast":
            return [b * 1.0 for b in sent], seconds
        if flaw == "seconds by rank":
            return sent, [seconds] * p
        if flaw == "a list, not a tuple":
            return [sent, seconds]
        return sent, seconds

    return collective_cost


@pytest.mark.parametrize("flaw, phrase", [
    ("tree time counts messages",
     ("collective_cost('broadcast', 'tree', 4096, 4, 1e-05, 1e-09): you said 4.2288e-05 s; the "
      "real run's messages take 2.8192e-05 s")),
    ("ring all-reduce sends 2n",
     ("you said the ranks send [8192, 8192, 8192, 8192] bytes; on 4 real ranks they sent "
      "[6144, 6144, 6144, 6144] (ring all_reduce")),
    ("every rank sends in a tree broadcast",
     ("you said the ranks send [4096, 4096, 4096, 4096] bytes; on 4 real ranks they sent "
      "[8192, 4096, 0, 0] (tree broadcast")),
    ("nbytes taken as one rank's input to all-gather",
     ("you said the ranks send [12288, 12288, 12288, 12288] bytes; on 4 real ranks they sent "
      "[3072, 3072, 3072, 3072] (ring all_gather")),
    ("bytes as floats", "[0] is [6144.0, 6144.0, 6144.0, 6144.0]; it must be a list of 4 ints"),
    ("seconds by rank", "1e-09)[1] is [6.6144"),
    ("a list, not a tuple", "returned list; return a tuple"),
])
def test_flawed_cost_models_fail(ref, flaw, phrase):
    assert_rejected(EX, flawed(ref, flaw), phrase)


def test_the_message_names_the_term_that_differs(ref):
    v = assert_rejected(EX, flawed(ref, "ring all-reduce moves n a step"), "The beta term differs")
    assert "your time moves 24576 bytes" in v.message and "the real run 6144" in v.message
    assert "alpha term" not in v.message, v.message
    v = assert_rejected(EX, flawed(ref, "tree time counts messages"), "The alpha term differs")
    assert "holds 3 latencies (alpha) on the critical path, the real run 2" in v.message
    assert "The beta term differs" in v.message, v.message


def test_log2_without_ceil_fails_on_a_hidden_world_of_three(ref):
    v = assert_rejected(EX, flawed(ref, "log2 without ceil"), "the real run's messages take")
    assert v.message.startswith("hidden check 2/2") and "'tree', " in v.message, v.message
    assert "collective_cost('broadcast', 'tree', " in v.message and ", 3, " in v.message
