"""distributed.comm-hook: plausible wrong comm hooks fail, called directly through run_checks.
Each is the reference answer with one step changed (``_hook`` builds them). The reference and
the stub are tested for every exercise in test_exercise_contract.py; correct variants of the
reference (dividing after the all-reduce, or in float32 before the cast) pass here."""
import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from grader.checks import run_checks
from tests.conftest import assert_rejected

EX = "distributed.comm-hook"


def _hook(dtype=torch.float16, divide="before", back=True, wait=False, into_buffer=True,
          size=None):
    """A comm hook: the buffer cast to ``dtype``, divided by the group's size (or ``size``)
    ``divide`` "before" the all-reduce (in ``dtype``), "float32" before the cast, "after" it,
    or "never"; all-reduced without waiting (``wait``: waited for in the hook); the future's
    value cast back to the buffer's dtype (``back``), copied into the buffer (``into_buffer``;
    False: the buffer is returned as it was, the result dropped)."""

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        p = size or group.size()
        buffer = bucket.buffer()
        if divide == "float32":
            compressed = (buffer / p).to(dtype)
        else:
            compressed = buffer.to(dtype)
            if divide == "before":
                compressed.div_(p)
        work = dist.all_reduce(compressed, group=group, async_op=True)
        if wait:
            work.wait()

        def decompress(fut):
            value = fut.value()[0]
            if divide == "after":
                value = value / p
            if not into_buffer:
                return buffer
            return buffer.copy_(value) if back else value

        return work.get_future().then(decompress)

    return hook


def calls_torchs_hook(process_group, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.fp16_compress_hook(process_group, bucket)


@pytest.mark.parametrize("answer, phrase", [
    (_hook(divide="never"), "They are 2 times the average: the all-reduce sums"),
    (_hook(dtype=torch.float32), "nothing was compressed"),
    (_hook(dtype=torch.bfloat16), ("Your hook all-reduced torch.bfloat16: compress to "
                                   "torch.float16")),
    (_hook(back=False), ("your hook's future holds a torch.float16 of shape [1732]; the "
                         "bucket's buffer is a torch.float32 of shape [1732]")),
    (_hook(wait=True), "the hook waited for its all-reduce"),
    (_hook(into_buffer=False), "rank 1 holds other gradients than rank 0"),
    (calls_torchs_hook, ("your answer ran torch/distributed/algorithms/ddp_comm_hooks/"
                         "default_hooks.py: fp16_compress_hook")),
    (default_hooks.fp16_compress_hook, ("your answer is torch/distributed/algorithms/"
                                        "ddp_comm_hooks/default_hooks.py: fp16_compress_hook")),
], ids=["summed", "float32", "bfloat16", "left-in-float16", "waits", "result-dropped",
        "calls-torch", "is-torch's"])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_left_in_float16_says_what_ddp_does_with_it():
    v = assert_rejected(EX, _hook(back=False), "DDP would cast it while copying it into the "
                                               ".grads")
    assert "backward 3 (step 1, micro-batch 3 of 3, synced)" in v.message, v.message


def test_dividing_by_two_fails_on_three_ranks():
    v = assert_rejected(EX, _hook(size=2), "on 3 ranks")
    assert v.message.startswith("hidden check 2/2") and "times as much as" in v.message, \
        v.message


@pytest.mark.parametrize("divide", ["after", "float32"])
def test_other_correct_orders_pass(divide):
    v = run_checks(EX, _hook(divide=divide), seed=0, hidden=True)
    assert v.status == "passed", v.message
