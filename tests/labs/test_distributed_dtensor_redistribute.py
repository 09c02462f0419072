"""distributed.dtensor-redistribute: plausible wrong redistribute functions fail, called directly
through run_checks. Most are the reference answer with one step changed. The reference and the
stub are tested for every exercise in test_exercise_contract.py."""
import pytest
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from tests.conftest import assert_rejected

EX = "distributed.dtensor-redistribute"


def flawed(flaw):
    """The reference answer with one flaw."""

    def redistribute(local, mesh, src, dst):
        coord, current = mesh.get_coordinate(), list(src)

        def along(t, dim):
            return t.movedim(dim, 0).contiguous()

        order = range(mesh.ndim) if flaw == "gathers the first mesh dimension first" else (
            reversed(range(mesh.ndim)))
        for i in order:
            if current[i].is_shard() and current[i] != dst[i]:
                d, k = current[i].dim, mesh.size(i)
                inp = along(local, d)
                world = flaw == "gathers on the world's group"
                k = dist.get_world_size() if world else k
                out = inp.new_empty((k * inp.shape[0], *inp.shape[1:]))
                dist.all_gather_single(out, inp, group=None if world else mesh.get_group(i))
                local, current[i] = out.movedim(0, d), Replicate()
        for i in range(mesh.ndim):
            if current[i].is_partial():
                if flaw == "sums gathered partials":
                    k = mesh.size(i)
                    out = local.new_empty((k * local.shape[0], *local.shape[1:]))
                    dist.all_gather_single(out, local.contiguous(), group=mesh.get_group(i))
                    local, current[i] = sum(out.chunk(k)), Replicate()
                    continue
                if dst[i].is_shard() and flaw != "all-reduces, then keeps a chunk":
                    d, k = dst[i].dim, mesh.size(i)
                    inp = along(local, d)
                    out = inp.new_empty((inp.shape[0] // k, *inp.shape[1:]))
                    dist.reduce_scatter_single(out, inp, group=mesh.get_group(i))
                    local, current[i] = out.movedim(0, d), dst[i]
                else:
                    local = local.clone()
                    dist.all_reduce(local, group=mesh.get_group(i))
                    current[i] = Replicate()
        for i in range(mesh.ndim):
            if dst[i].is_shard() and current[i] != dst[i]:
                k = mesh.size(i)
                at = dist.get_rank() % k if flaw == "chunk at the global rank" else coord[i]
                local = local.chunk(k, dim=dst[i].dim)[at]
                current[i] = dst[i]
        return local.contiguous()

    return redistribute


def through_the_full_tensor(local, mesh, src, dst):
    """Assembles the whole tensor on every rank, then keeps this rank's chunks."""
    full = DTensor.from_local(local, mesh, src, run_check=False).full_tensor()
    for i, p in enumerate(dst):
        if p.is_shard():
            full = full.chunk(mesh.size(i), dim=p.dim)[mesh.get_coordinate()[i]]
    return full.contiguous()


def wrapped_in_a_dtensor(local, mesh, src, dst):
    """The right local tensor, handed back wrapped as a DTensor (no collective of its own)."""
    return DTensor.from_local(flawed("")(local, mesh, src, dst), mesh, dst, run_check=False)


def dtensors_own(local, mesh, src, dst):
    """Lets DTensor do the work it is asked to do by hand."""
    return DTensor.from_local(local, mesh, src, run_check=False).redistribute(mesh, dst).to_local()


def planned_by_dtensor(local, mesh, src, dst):
    """Asks DTensor's planner for the steps, then runs the collectives itself (here: the
    reference's): the plan is the part the exercise asks for."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._redistribute import _gen_transform_infos

    meta = TensorMeta(local.shape, local.stride(), local.dtype)
    _gen_transform_infos(DTensorSpec(mesh, src, meta), DTensorSpec(mesh, dst, meta))
    return flawed("")(local, mesh, src, dst)


@pytest.mark.parametrize("answer, phrase", [
    (flawed("sums gathered partials"),
     "you issued 1 all_gather; DTensor's redistribute issues 1 all_reduce"),
    (wrapped_in_a_dtensor,
     "the value redistribute returned has type DTensor, a subclass of Tensor"),
    (dtensors_own, "your answer ran torch/distributed/tensor/_redistribute.py: "),
    (through_the_full_tensor, "your answer ran torch/distributed/tensor/_redistribute.py: "),
    (planned_by_dtensor, "your answer ran torch/distributed/tensor/_redistribute.py: "
                         "_gen_transform_infos"),
])
def test_wrong_answers_fail(answer, phrase):
    v = assert_rejected(EX, answer, phrase)
    assert v.message.startswith("check 1/2"), v.message


@pytest.mark.parametrize("answer", [flawed("all-reduces, then keeps a chunk")])
def test_an_all_reduce_where_dtensor_reduce_scatters_fails(answer):
    v = assert_rejected(EX, answer, "you issued 1 all_reduce; DTensor's redistribute issues 1 "
                                    "reduce_scatter")
    assert "for (P(sum)) -> (S(0)) on a mesh of shape (4,)" in v.message, v.message


@pytest.mark.parametrize("flaw, phrase, where", [
    ("chunk at the global rank", "for (R, R) -> (S(0), S(1)) on a mesh of shape (2, 2)",
     "check 1/2"),
    ("gathers the first mesh dimension first",
     "for (S(0), S(0)) -> (R, R) on a mesh of shape (2, 2)", "hidden check 2/2"),
    # (no flaw: a shard stays whenever its own mesh dimension keeps it, even when the mesh
    # dimension before it, splitting the same tensor dimension, changes)
    ("", "for (S(0), S(0)) -> (R, S(0)) on a mesh of shape (2, 2)", "hidden check 2/2"),
])
def test_wrong_answers_fail_on_a_two_dimensional_mesh(flaw, phrase, where):
    v = assert_rejected(EX, flawed(flaw), phrase)
    assert v.message.startswith(where), v.message
    assert "your local tensor differs from DTensor's" in v.message, v.message


def test_a_collective_on_the_worlds_group_names_the_groups():
    v = assert_rejected(EX, flawed("gathers on the world's group"),
                        "your all_gather ran on the process group of ranks [0, 1, 2, 3] (the "
                        "whole world); each step of a redistribution runs on one mesh "
                        "dimension's group, and this rank's are dimension 0: [0, 2]; "
                        "dimension 1: [0, 1] (mesh.get_group(dim))")
    assert "for (S(0), S(1)) -> (R, R) on a mesh of shape (2, 2)" in v.message, v.message
