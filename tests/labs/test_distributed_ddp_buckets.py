"""distributed.ddp-buckets: plausible wrong bucket predictions fail, called directly through
run_checks. Each is the reference answer with one rule changed. The reference and the stub are
tested for every exercise in test_exercise_contract.py."""
import pytest

from tests.conftest import assert_rejected

EX = "distributed.ddp-buckets"
MiB = 1024 * 1024


def flawed(flaw):
    """The reference answer with one flaw."""

    def predict_buckets(model, sample, bucket_cap_mb=None):
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        first = [[n for n, _ in (model.named_parameters() if flaw == "frozen included"
                                 else params)]]
        ready = []
        hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: ready.append(n))
                 for n, p in params]
        model(sample).sum().backward()
        for h in hooks:
            h.remove()
        if flaw == "reverse registration order":  # (what DDP starts from, not what it rebuilds)
            ready = [n for n, _ in reversed(params)]
        if flaw == "reverse of the forward calls":  # (right until a module runs twice)
            called = []
            hooks = [m.register_forward_hook(lambda m, i, o: called.append(m))
                     for m in model.modules() if not list(m.children())]
            model(sample)
            for h in hooks:
                h.remove()
            owner = {id(p): n for n, p in params}
            ready = list(dict.fromkeys(owner[id(p)] for m in reversed(called)
                                       for p in reversed(list(m.parameters(recurse=False)))
                                       if id(p) in owner))
        cap = 25 * MiB if bucket_cap_mb is None else int(bucket_cap_mb * MiB)
        caps = [MiB if bucket_cap_mb is None and flaw != "no 1 MiB first bucket" else cap, cap]
        size = {n: p.numel() * p.element_size() for n, p in params}
        rebuilt, bucket, total = [], [], 0
        for n in ready:
            limit = caps[min(len(rebuilt), 1)]
            if flaw == "closes before it would overflow" and bucket and total + size[n] > limit:
                rebuilt.append(bucket)
                bucket, total = [], 0
            bucket.append(n)
            total += size[n]
            past = total > limit if flaw == "closes only past the cap" else total >= limit
            if flaw != "closes before it would overflow" and past:
                rebuilt.append(bucket)
                bucket, total = [], 0
        if bucket:
            rebuilt.append(bucket)
        if flaw == "first iteration already bucketed":
            first = rebuilt
        if flaw == "a list":
            return [first, rebuilt]
        return {"first": first, "rebuilt": rebuilt}

    return predict_buckets


@pytest.mark.parametrize("flaw, phrase", [
    ("first iteration already bucketed",
     ("in the first iteration: you predicted 2 bucket(s) [4.bias, 4.weight, 2.bias, 2.weight | "
      "0.bias, 0.weight]; DDP all-reduced 1: [0.weight, 0.bias, 2.weight, 2.bias, 4.weight, "
      "4.bias]")),
    ("closes before it would overflow",
     ("after DDP rebuilt its buckets (iteration 2 on): you predicted 3 bucket(s) [4.bias, "
      "4.weight, 2.bias | 2.weight | 0.bias, 0.weight]; DDP all-reduced 2")),
    ("a list", "predict_buckets returned list; return a dict with the keys 'first' and 'rebuilt'"),
    ("reverse registration order",
     ("run inp, early, late, out; bucket_cap_mb=0.01, after DDP rebuilt its buckets (iteration 2 "
      "on): you predicted 2 bucket(s) [out.bias, out.weight, early.bias")),
])
def test_wrong_answers_fail(flaw, phrase):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_ready_order_as_the_reverse_of_the_forward_calls_fails_on_a_layer_run_twice():
    v = assert_rejected(EX, flawed("reverse of the forward calls"), "Reused(40)")
    assert v.message.startswith("hidden check 2/2"), v.message
    assert "after DDP rebuilt its buckets (iteration 2 on): you predicted" in v.message


@pytest.mark.parametrize("flaw, phrase", [
    ("frozen included", "with layer 1 frozen, bucket_cap_mb=0.0209, in the first iteration"),
    ("closes only past the cap", "(the last layer exactly), after DDP rebuilt its buckets"),
    ("no 1 MiB first bucket",
     ("the default bucket_cap_mb (None), after DDP rebuilt its buckets (iteration 2 on): you "
      "predicted 1 bucket(s)")),
])
def test_wrong_answers_fail_on_hidden_cases(flaw, phrase):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith("hidden check 2/2"), v.message


def assigned_by_ddp(model, sample, bucket_cap_mb=None):
    """Asks DDP's own bucket assignment (the function the Reducer's first buckets come from),
    then answers as the reference does."""
    import torch.distributed as dist

    dist._compute_bucket_assignment_by_size([p for p in model.parameters()], [1 << 20])
    return flawed("")(model, sample, bucket_cap_mb)


def wrapped_in_ddp(model, sample, bucket_cap_mb=None):
    """Wraps the model in DDP on a one-rank process group (no process started) to read its
    buckets, then answers as the reference does."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        DistributedDataParallel(model)
    finally:
        dist.destroy_process_group()
    return flawed("")(model, sample, bucket_cap_mb)


@pytest.mark.parametrize("answer, phrase", [
    (assigned_by_ddp, "your answer ran torch/_C/_distributed_c10d: "
                      "_compute_bucket_assignment_by_size"),
    (wrapped_in_ddp, "your answer ran torch/nn/parallel/distributed.py: "),
])
def test_answers_that_run_ddp_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message
