"""distributed.mini-ddp: plausible wrong MiniDDP classes fail, called directly through
run_checks. Each is the reference answer (rewritten with methods, so that one step can be
overridden) with one step changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.conftest import assert_rejected

EX = "distributed.mini-ddp"


class MiniDDP(nn.Module):
    """The reference answer, one method per step."""

    def __init__(self, module, bucket_cap_mb=25.0):
        super().__init__()
        self.module = module
        self.buckets = self._bucket(self._params(module), bucket_cap_mb * 1024 * 1024)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._ready, self._works, self._queued = [0] * len(self.buckets), [], False
        self._next = 0  # the bucket whose all-reduce goes next (they go in bucket order)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _params(self, module):
        return reversed([p for p in module.parameters() if p.requires_grad])

    def _bucket(self, params, cap):
        buckets, bucket, size = [], [], 0
        for p in params:
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                buckets.append(bucket)
                bucket, size = [], 0
        return buckets + ([bucket] if bucket else [])

    def _grad_ready(self, p):
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._queued = True
        self._ready[self._bucket_of[id(p)]] += 1
        while self._next < len(self.buckets) and \
                self._ready[self._next] == len(self.buckets[self._next]):
            self._launch(self._next)
            self._next += 1

    def _launch(self, i):
        flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
        self._works.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def _average(self, flat):
        flat /= dist.get_world_size()

    def _finish(self):
        for i, flat, work in self._works:
            work.wait()
            self._average(flat)
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
                offset += q.numel()
        self._reset()

    def _reset(self):
        self._works, self._ready, self._queued = [], [0] * len(self.buckets), False
        self._next = 0


class LaunchedWhenFull(MiniDDP):
    """Launches each bucket as soon as it is full, out of bucket order when it fills early."""

    def _grad_ready(self, p):
        if not self._queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._queued = True
        i = self._bucket_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)


class OneAllReducePerParameter(MiniDDP):
    def _launch(self, i):
        for q in self.buckets[i]:
            flat = q.grad.reshape(-1)  # (a view of .grad: the all-reduce writes into it)
            self._works.append((None, flat, dist.all_reduce(flat, async_op=True)))

    def _finish(self):
        for _, flat, work in self._works:
            work.wait()
            self._average(flat)
        self._reset()


class Summed(MiniDDP):
    def _average(self, flat):
        pass


class AllReducedAfterBackward(MiniDDP):
    """Waits for every gradient, then all-reduces the buckets from the final callback."""

    def _launch(self, i):
        pass

    def _finish(self):
        for i in range(len(self.buckets)):
            MiniDDP._launch(self, i)
        super()._finish()


class NeverResets(MiniDDP):
    """Never resets its per-bucket counts: only the first backward all-reduces anything."""

    def _reset(self):
        self._works, self._queued, self._next = [], False, 0


class ForwardOrder(MiniDDP):
    def _params(self, module):
        return [p for p in module.parameters() if p.requires_grad]


class WrapsDDP(MiniDDP):
    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.buckets = self._bucket(self._params(module), bucket_cap_mb * 1024 * 1024)
        self.module = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)


class WaitsInTheHook(MiniDDP):
    """All-reduces each bucket with a blocking call from its hook: right values, no overlap."""

    def _launch(self, i):
        flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
        dist.all_reduce(flat)
        self._works.append((i, flat, _Done()))


class _Done:
    def wait(self):
        return True


class CallbackOnce(MiniDDP):
    """Queues its end-of-backward callback in the first backward only."""

    def _grad_ready(self, p):
        if not getattr(self, "_ever_queued", False):
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._ever_queued = True
        self._queued = True  # (so the step below never queues it again)
        MiniDDP._grad_ready(self, p)


class DrivesTheReducer(MiniDDP):
    """Its own buckets, handed to DDP's C++ Reducer, which hooks, buckets and all-reduces."""

    def __init__(self, module, bucket_cap_mb=25.0):
        nn.Module.__init__(self)
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = self._bucket(self._params(module), bucket_cap_mb * 1024 * 1024)
        index = {id(p): i for i, p in enumerate(params)}
        cap = int(bucket_cap_mb * 1024 * 1024)
        self.reducer = dist.Reducer(params, [[index[id(p)] for p in b] for b in self.buckets],
                                    [cap] * len(self.buckets), dist.group.WORLD,
                                    [False] * len(params), cap, False, False, {}, cap)

    def forward(self, *args, **kwargs):
        self.reducer.prepare_for_forward()
        out = self.module(*args, **kwargs)
        self.reducer.prepare_for_backward([])
        return out


@pytest.mark.parametrize("answer, phrase", [
    (DrivesTheReducer, "your answer ran torch/_C/_distributed_c10d: prepare_for_forward"),
    (WaitsInTheHook, "the hook waited for it, so nothing overlapped"),
    (CallbackOnce, "rank 1 holds other gradients than rank 0 (backward 1 was right)"),
    (OneAllReducePerParameter, ("backward 1 issued 6 all_reduce; DDP issues one all_reduce per "
                                "bucket: 2 here")),
    (Summed, ("differs from 3 steps on the whole batch in one process (are the gradients "
              "averaged over the ranks, not summed")),
    (AllReducedAfterBackward, ("issued its first all-reduce after all 6 gradients were ready: "
                               "nothing overlapped")),
    (NeverResets, "backward 2 issued none; DDP issues one all_reduce per bucket: 2 here"),
    (ForwardOrder, "with parameters in reverse order, a bucket closing once it holds 0.004 MiB"),
    (WrapsDDP, "your answer ran torch/nn/parallel/distributed.py: DistributedDataParallel"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


class BucketsFrozenParameters(MiniDDP):
    """Buckets every parameter (hooks only on those that require grad: the others refuse one)."""

    def _params(self, module):
        return reversed(list(module.parameters()))


class ClosesOnlyPastTheCap(MiniDDP):
    """Closes a bucket once it holds more than the cap (DDP closes it once it holds the cap)."""

    def _bucket(self, params, cap):
        buckets, bucket, size = [], [], 0
        for p in params:
            bucket.append(p)
            size += p.numel() * p.element_size()
            if size > cap:
                buckets.append(bucket)
                bucket, size = [], 0
        return buckets + ([bucket] if bucket else [])


def test_closing_only_past_the_cap_fails_on_a_hidden_case():
    v = assert_rejected(EX, ClosesOnlyPastTheCap, "(the last layer's size exactly)")
    assert v.message.startswith("hidden check 2/2") and "MiniDDP.buckets is" in v.message


def test_launching_a_bucket_before_an_earlier_one_fails_on_a_hidden_case():
    v = assert_rejected(EX, LaunchedWhenFull, "DDP launches buckets in bucket order")
    assert v.message.startswith("hidden check 2/2") and "Crossed(24) on 2 ranks" in v.message
    assert ("issued its all-reduce number 1 while bucket 0 (out.bias, out.weight, early.bias, "
            "early.weight) still waited for early.bias, early.weight") in v.message, v.message


def test_bucketing_frozen_parameters_fails_on_a_hidden_case():
    v = assert_rejected(EX, BucketsFrozenParameters, "with layer 1 frozen on 2 ranks")
    assert v.message.startswith("hidden check 2/2") and "MiniDDP.buckets is" in v.message
