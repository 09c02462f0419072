"""distributed.mini-fsdp: plausible wrong MiniFSDP classes fail, called directly through
run_checks. Each is the reference answer (rewritten with methods, so that one step can be
overridden) with one step changed. The reference and the stub are tested for every exercise in
test_exercise_contract.py."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.conftest import assert_rejected

EX = "distributed.mini-fsdp"
PUBLIC = "for Stack([16, 40, 24, 30], out=3) on 4 ranks (2,507 parameters), "


class MiniFSDP(nn.Module):
    """The reference answer, one method per step."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.rank, self.p = dist.get_rank(), dist.get_world_size()
        named = list(module.named_parameters())
        self._slots = []
        for name, q in named:
            owner, _, attr = name.rpartition(".")
            self._slots.append((module.get_submodule(owner), attr, q.shape, q.requires_grad))
        flat = torch.cat([q.detach().reshape(-1) for _, q in named])
        self.numel, self.s = flat.numel(), -(-flat.numel() // self.p)
        self._numels = [q.numel() for _, q in named] + [self.s * self.p - self.numel]
        self.shard = nn.Parameter(self._take(flat))
        self._free_originals()

    def _take(self, flat):
        padded = nn.functional.pad(flat, [0, self.s * self.p - self.numel])
        return padded[self.rank * self.s:(self.rank + 1) * self.s].clone()

    def _free_originals(self):
        for owner, attr, _, _ in self._slots:
            del owner._parameters[attr]

    def forward(self, *args, **kwargs):
        full = torch.empty(self.p * self.shard.numel())
        dist.all_gather_single(full, self.shard.detach())
        full.requires_grad_(True)
        self._views(full)
        full.register_post_accumulate_grad_hook(self._reduce)
        return self.module(*args, **kwargs)

    def _views(self, full):
        for (owner, attr, shape, trains), piece in zip(self._slots, full.split(self._numels)):
            setattr(owner, attr, piece.view(shape) if trains else piece.detach().view(shape))

    def _reduce(self, full):
        grad = torch.empty_like(self.shard)
        dist.reduce_scatter_single(grad, self._flat_grad(full))
        self._average(grad)
        self.shard.grad = grad if self.shard.grad is None else self.shard.grad + grad
        self._free(full)

    def _flat_grad(self, full):
        return full.grad

    def _average(self, grad):
        grad /= self.p

    def _free(self, full):
        full.grad = None
        full.untyped_storage().resize_(0)


class NoPadding(MiniFSDP):
    """Splits the flat parameter as it comes: the last ranks' shards are one element short."""

    def _take(self, flat):
        return flat.tensor_split(self.p)[self.rank].clone()


class ShardAtTheFloorOffset(MiniFSDP):
    """Shards of the padded size, taken at rank * (numel // p): a rank's shard starts early."""

    def _take(self, flat):
        padded = nn.functional.pad(flat, [0, self.s * self.p - self.numel])
        start = self.rank * (self.numel // self.p)
        return padded[start:start + self.s].clone()


class ShardIsAView(MiniFSDP):
    """Keeps a slice of the flat parameter without copying it: the whole of it stays alive."""

    def _take(self, flat):
        padded = nn.functional.pad(flat, [0, self.s * self.p - self.numel])
        return padded[self.rank * self.s:(self.rank + 1) * self.s]


class KeepsTheOriginals(MiniFSDP):
    """Leaves the module's own parameters where they were (and so sets the views elsewhere)."""

    def _free_originals(self):
        self._originals = [(owner, attr, owner._parameters.pop(attr))
                           for owner, attr, _, _ in self._slots]


class Summed(MiniFSDP):
    def _average(self, grad):
        pass


class AllReducedThenSliced(MiniFSDP):
    """All-reduces the whole flat gradient, then keeps this rank's slice: right values."""

    def _reduce(self, full):
        dist.all_reduce(full.grad)
        grad = full.grad[self.rank * self.s:(self.rank + 1) * self.s] / self.p
        self.shard.grad = grad if self.shard.grad is None else self.shard.grad + grad
        self._free(full)


class KeepsTheGathered(MiniFSDP):
    """Drops the gathered gradient but not the gathered parameter (the views keep it)."""

    def _free(self, full):
        full.grad = None


class GradientInReverseOrder(MiniFSDP):
    """Lays the flat gradient out in reverse parameter order (as DDP's buckets are), not as the
    flat parameter is: a rank's gradient shard covers other elements than its shard does."""

    def _flat_grad(self, full):
        pieces = full.grad.split(self._numels)
        return torch.cat([*reversed(pieces[:-1]), pieces[-1]])


class FrozenTrained(MiniFSDP):
    """Gives every view a gradient, frozen parameters' too."""

    def _views(self, full):
        for (owner, attr, shape, _), piece in zip(self._slots, full.split(self._numels)):
            setattr(owner, attr, piece.view(shape))


class WrapsFSDP1(nn.Module):
    """FSDP1 itself, its FlatParameter exposed as the shard."""

    def __init__(self, module):
        super().__init__()
        from torch.distributed.fsdp import FullyShardedDataParallel

        self.module = FullyShardedDataParallel(module.requires_grad_(True),
                                               device_id=torch.device("cpu"))
        (self.shard,) = self.module.parameters()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


@pytest.mark.parametrize("answer, phrase", [
    (NoPadding, PUBLIC + "the ranks' shards hold [627, 627, 627, 626] elements (rank 0, 1, ...); "
     "FSDP1's FlatParameter, sharded on 4 ranks, holds [627, 627, 627, 627]. Together they hold "
     "the 2,507 parameters without padding: pad the flat parameter with zeros"),
    (ShardAtTheFloorOffset, PUBLIC + "MiniFSDP(model).shard on rank 1 holds other values than "
     "FSDP1's FlatParameter shard on that rank. It is elements [626, 1,253) of the flat "
     "parameter; rank 1's shard is elements [627, 1,254)"),
    (ShardIsAView, PUBLIC + "rank 0's shard lives in a storage of 10,032 bytes, for 627 "
     "elements: it is a view of a larger tensor"),
    (KeepsTheOriginals, PUBLIC + "once MiniFSDP(model) has returned, rank 0 holds 12,536 bytes "
     "of tensors"),
    (Summed, "It is 4 times FSDP2's: a reduce-scatter sums over the ranks, and FSDP averages"),
    (AllReducedThenSliced, PUBLIC + "backward 1 issued 1 all_reduce on rank 0; FSDP "
     "reduce-scatters the flat gradient"),
    (WrapsFSDP1, "your answer ran torch/distributed/fsdp/"),
    (GradientInReverseOrder, PUBLIC + "after backward 1, the gradient of layers.0.weight, "
     "reassembled from the ranks' gradient shards"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


def test_keeping_the_gathered_parameter_fails_naming_what_is_still_alive():
    v = assert_rejected(EX, KeepsTheGathered, PUBLIC + "after backward 1, rank 0 holds 15,048 "
                        "bytes of tensors")
    assert v.message.startswith("check 1/2"), v.message
    assert "resize its storage to 0" in v.message, v.message
    assert "Also alive on that rank: float32 [2508] (10,032 bytes)." in v.message, v.message


def test_training_frozen_parameters_fails_on_a_hidden_case():
    v = assert_rejected(EX, FrozenTrained, "with layers[1] frozen on 3 ranks")
    assert v.message.startswith("hidden check 2/2"), v.message
    assert "which does not require grad (it is frozen)" in v.message, v.message


def test_an_oracle_world_leaves_the_callers_tensors_where_they_are():
    """multiprocessing pickles a forkserver world's arguments with torch's reductions, which
    move a tensor's storage into shared memory in place; the judge encodes the same tensor for
    the probe meanwhile (it read freed memory: a corrupt first row now and then), so an oracle
    world gets copies."""
    from labs.distributed.checks._oracles import oracle

    x = torch.randn(4, 3)
    where = x.untyped_storage().data_ptr()
    (got,) = oracle(torch.clone, 1, x).result()
    assert torch.equal(got, x) and not x.is_shared()
    assert x.untyped_storage().data_ptr() == where
