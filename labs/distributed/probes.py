"""The distributed lab's probes: what runs in the learner's kernel when an exercise is judged (see
``grader.kernel.probe``). Each builds what the answer needs from plain parameters (a model of
``labs/distributed/models.py`` from a plain spec, a seed, shapes, a world size), calls the answer
(on ranks it starts with :func:`labs.distributed.launch.run` where the answer runs on every rank)
and returns what it observed as plain data: what the answer returned, the tensors the ranks hold
afterwards, the communication each rank issued (:class:`CommLog`), timings. A rank that raised,
exited or hung comes back as ``{"failure": message}`` (or ``{"failed": message}`` where the
message is one a check would give, e.g. a process group left initialized in the notebook); the
judges in ``labs/distributed/checks`` compute what torch gives in the grader's own process, with
ranks of their own, and decide. Nothing here knows a right answer.
"""
from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from grader.checks import AnswerError, CheckFailure, probe
from labs.distributed import launch
from labs.distributed.models import build

#: c10d / functional-collective op name -> the collective it is, in the course's words
KINDS = {
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
    "broadcast_": "broadcast", "broadcast": "broadcast", "reduce_": "reduce",
    "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}
#: the kinds that run on a process group (not a peer)
COLLECTIVES = frozenset(KINDS.values()) - {"send", "recv"}


@dataclass(frozen=True)
class Comm:
    """One communication op a rank issued: its ``kind`` (a value of :data:`KINDS`, or the op's
    own name), the ``peer`` rank of a send or recv (else None), the ``bytes`` of its tensors
    (for a send, what it sends; for a recv, the buffer it receives into), the global ranks of
    its process ``group`` (None where the op names none) and the ``dtypes`` of its tensors."""

    kind: str
    peer: int | None
    bytes: int
    group: tuple[int, ...] | None = None
    dtypes: tuple[str, ...] = ()


def _group_of(args) -> tuple[int, ...] | None:
    """The global ranks of the process group a c10d op runs on: a ``ProcessGroup`` argument
    (boxed as a ScriptObject by the dispatcher), or a functional collective's ``group_name``
    (its last str argument). (torch/csrc/distributed/c10d/Ops.cpp; torch/distributed/
    _functional_collectives.py; distributed_c10d.py: _resolve_process_group.)"""
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in args:
        if isinstance(a, torch.ScriptObject):
            return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(a)))
    names = [a for a in args if isinstance(a, str)]
    if names:
        return tuple(dist.get_process_group_ranks(_resolve_process_group(names[-1])))
    return None


class CommLog(TorchDispatchMode):
    """Record every c10d op issued under it, in order, in ``self.comms``.

    Since PyTorch 2.1 each ``torch.distributed`` call reaches its backend through a dispatcher op
    (``c10d::send``, ``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor``...), so
    a ``TorchDispatchMode`` sees them all, whichever API issued them (``dist.*``, a
    ``ProcessGroup`` method, functional collectives, DTensor).
    (torch/csrc/distributed/c10d/Ops.cpp: the c10d op registrations.)"""

    def __init__(self):
        super().__init__()
        self.comms: list[Comm] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional"):
            name = func._opname
            tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                       if isinstance(t, torch.Tensor)]
            peer = args[2] if name in ("send", "recv_") else None
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            self.comms.append(Comm(KINDS.get(name, name), peer, nbytes, _group_of(args),
                                   tuple(str(t.dtype) for t in tensors)))
        return func(*args, **(kwargs or {}))

    def counts(self) -> dict[str, int]:
        """How many ops of each kind (``wait_tensor`` and the like left out)."""
        found: dict[str, int] = {}
        for c in self.comms:
            if c.kind in set(KINDS.values()):
                found[c.kind] = found.get(c.kind, 0) + 1
        return found

    def plain(self) -> list[list]:
        """``self.comms`` as ``[kind, peer, bytes]`` lists."""
        return [[c.kind, c.peer, c.bytes] for c in self.comms]


def describe(counts: dict[str, int]) -> str:
    """``{"all_gather": 2}`` as ``"2 all_gather"``; ``"none"`` when empty."""
    return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "none"


# The first TorchDispatchMode a process enters imports torch's symbolic-shape machinery (sympy
# and ~800 modules, about 1.4 s). Enter one here, in the process that forks the ranks, so that
# they inherit those modules instead of each importing them again.
with CommLog():
    torch.zeros(())


def _ranks(fn, world_size: int, *args) -> dict:
    """``{"ranks": [what each rank returned]}`` from :func:`launch.run`, or ``{"failure":
    message}`` when a rank raised, exited or hung (``{"failed": message}`` for a message that
    says the answer is wrong). A stub raised on a rank, or a rank out of memory, is raised here
    (the grader reports them as such)."""
    try:
        return {"ranks": launch.run(fn, world_size, *args, echo=False)}
    except CheckFailure as exc:
        return {"failed": str(exc)}
    except AnswerError as exc:
        return {"failure": str(exc)}


def ranks_of(reply: dict) -> list:
    """What each rank returned, from a reply :func:`_ranks` made (the judges read it): raises
    CheckFailure for ``failed``, AnswerError for ``failure``, as the ranks' own run would."""
    if "failed" in reply:
        raise CheckFailure(reply["failed"])
    if "failure" in reply:
        raise AnswerError(reply["failure"])
    return reply["ranks"]


# ------------------------------------------------------------------- distributed.fsdp-memory
@probe
def fsdp_memory(answer, spec: dict, world_size: int, reshard_after_forward) -> object:
    """``answer(model, world_size, reshard_after_forward)`` on a fresh model built from ``spec``
    (:func:`labs.distributed.models.build`): what it returned."""
    return answer(build(spec), world_size, reshard_after_forward)


# ------------------------------------------------------------------- distributed.ddp-buckets
@probe
def ddp_buckets(answer, spec: dict, sample: torch.Tensor, bucket_cap_mb) -> object:
    """``answer(model, sample, bucket_cap_mb)`` on a fresh model built from ``spec``: what it
    returned."""
    return answer(build(spec), sample.clone(), bucket_cap_mb)


# ---------------------------------------------------------------- distributed.ring-allreduce
def ring_input(seed: int, case: int, rank: int, shape, dtype: torch.dtype) -> torch.Tensor:
    """The tensor rank ``rank`` holds in case ``case``: seeded ``randn`` (floating dtypes) or
    ``randint(-1000, 1000)`` (integer dtypes) of ``shape``."""
    g = torch.Generator().manual_seed(seed * 7919 + case * 101 + rank)
    if dtype.is_floating_point:
        return torch.randn(tuple(shape), generator=g, dtype=dtype)
    return torch.randint(-1000, 1000, tuple(shape), generator=g, dtype=dtype)


def ring_case(shape, dtype: torch.dtype, world_size: int) -> str:
    """A case in words, as messages name it."""
    return f"a {dtype} tensor of shape {list(shape)} at world size {world_size}"


def _ring_rank(ring_all_reduce, seed: int, cases: list) -> list[dict]:
    """On every rank, for each case ``[shape, dtype]``: ``ring_all_reduce(t)`` on this rank's
    :func:`ring_input` ``t``; ``{"tensor": t afterwards, "returned_tensor": whether it returned
    a tensor, "comms": [[kind, peer, bytes], ...] it issued}``."""
    rank, p = dist.get_rank(), dist.get_world_size()
    seen = []
    for i, (shape, dtype) in enumerate(cases):
        got = ring_input(seed, i, rank, shape, dtype)
        with CommLog() as log:
            try:
                returned = ring_all_reduce(got)
            except Exception as exc:  # (the verdict says which case it raised on)
                exc.add_note(f"for {ring_case(shape, dtype, p)}")
                raise
        seen.append({"tensor": got.detach().clone(),
                     "returned_tensor": isinstance(returned, torch.Tensor),
                     "comms": log.plain()})
    return seen


@probe
def ring_all_reduce(answer, seed: int, world_size: int, cases: list) -> dict:
    """``answer`` on ``world_size`` ranks for each case ``[shape, dtype]`` (:func:`_ring_rank`):
    ``{"ranks": [each rank's list of cases]}``, or ``{"failure": message}``."""
    return _ranks(_ring_rank, world_size, answer, seed, [[list(s), d] for s, d in cases])


# ---------------------------------------------------------- distributed.dtensor-redistribute
def placement(code: str):
    """A placement from its plain code: ``"S0"``/``"S1"``... (``Shard(d)``), ``"R"``
    (``Replicate()``), ``"P"`` (``Partial()``)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if code == "R":
        return Replicate()
    if code == "P":
        return Partial()
    return Shard(int(code[1:]))


def placements_name(codes) -> str:
    """Placements (by code) as DTensor prints them: ``["S0", "R"]`` as ``"(S(0), R)"``."""
    return "(" + ", ".join(str(placement(c)) for c in codes) + ")"


def dtensor_source(full: torch.Tensor, mesh, src: tuple, seed: int) -> torch.Tensor:
    """This rank's local tensor of a DTensor placed as ``src`` (placements): ``full`` sharded
    and replicated, then along each Partial mesh dimension split into seeded random parts."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    local = distribute_tensor(full, mesh, [Replicate() if p.is_partial() else p
                                           for p in src]).to_local()
    coord = mesh.get_coordinate()
    for i, p in enumerate(src):
        if p.is_partial():  # parts summing to local: local/k + noise, and at coordinate 0
            g = torch.Generator().manual_seed(seed * 31 + i)  # local/k - (k - 1) noise
            noise = torch.randn(local.shape, generator=g)
            local = local / mesh.size(i) + noise * (1 if coord[i] else 1 - mesh.size(i))
    return local


def comm_counts(mode) -> dict[str, int]:
    """A ``CommDebugMode``'s collectives by kind (a value of :data:`KINDS`)."""
    found: dict[str, int] = {}
    for op, n in mode.get_comm_counts().items():
        kind = KINDS.get(str(op).rsplit(".", 1)[-1], str(op))
        found[kind] = found.get(kind, 0) + n
    return found


def dtensor_case(src, dst, mesh_shape, shape, rank: int) -> str:
    """A case in words, as messages name it (placements by code)."""
    coord, left = [], rank
    for size in reversed(tuple(mesh_shape)):  # (init_device_mesh lays ranks out row-major)
        coord.insert(0, left % size)
        left //= size
    return (f"{placements_name(src)} -> {placements_name(dst)} on a mesh of shape "
            f"{tuple(mesh_shape)} (a tensor of shape {list(shape)}, rank {rank} at mesh "
            f"coordinate {tuple(coord)})")


def _redistribute_rank(redistribute, seed: int, cases: list, shape: list) -> list[dict]:
    """On every rank, for each ``[mesh_shape, [[src, dst], ...]]`` of ``cases`` (placements by
    code): ``redistribute(local, mesh, src, dst)`` on this rank's :func:`dtensor_source`;
    ``{"got": the tensor it returned when a plain tensor, else None, "type": its type's name,
    "tensor": whether it is a tensor, "counts": its collectives by kind, "groups": [[kind,
    global ranks of its group], ...] of each collective in order}``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    full = torch.randn(tuple(shape), generator=torch.Generator().manual_seed(seed))
    seen = []
    for mesh_shape, pairs in cases:
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        for src, dst in pairs:
            src_p, dst_p = tuple(map(placement, src)), tuple(map(placement, dst))
            local = dtensor_source(full, mesh, src_p, seed)
            with CommDebugMode() as mode, CommLog() as log:
                try:
                    got = redistribute(local.clone(), mesh, src_p, dst_p)
                except Exception as exc:  # (the verdict says which case it raised on)
                    rank = dist.get_rank()
                    exc.add_note(f"for {dtensor_case(src, dst, mesh_shape, shape, rank)}")
                    raise
            plain_tensor = type(got) in (torch.Tensor, torch.nn.Parameter)
            seen.append({"got": got.detach().clone() if plain_tensor else None,
                         "type": type(got).__name__, "tensor": isinstance(got, torch.Tensor),
                         "counts": comm_counts(mode),
                         "groups": [[c.kind, list(c.group)] for c in log.comms
                                    if c.kind in COLLECTIVES and c.group is not None]})
    return seen


@probe
def redistribute(answer, seed: int, cases: list, shape: list) -> dict:
    """``answer`` on 4 ranks for each case (:func:`_redistribute_rank`): ``{"ranks": [each
    rank's list of cases]}``, or ``{"failure": message}``."""
    import torch.distributed.tensor  # noqa: F401  (launch.run warms DTensor up once, here)

    return _ranks(_redistribute_rank, 4, answer, seed, cases, shape)


# ------------------------------------------------------------------- distributed.mini-ddp
class _Issued(CommLog):
    """A CommLog that also notes, for each all-reduce, how many gradients were ready when it
    was issued and when (``time.perf_counter``, s)."""

    def __init__(self, ready: list[int]):
        super().__init__()
        self.ready, self.at_issue, self.issued_at = ready, [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("c10d", "_c10d_functional") and "reduce" in func._opname:
            self.at_issue.append(self.ready[0])
            self.issued_at.append(time.perf_counter())
        return super().__torch_dispatch__(func, types, args, kwargs)


def _ddp_rank(MiniDDP, spec: dict, cap: float, x: torch.Tensor, y: torch.Tensor, steps: int,
              lr: float, late: float) -> dict:
    """On every rank: ``steps`` of SGD (``lr``, MSE loss) through ``MiniDDP(model, cap)`` on this
    rank's slice of (x, y); with ``late`` (s), the last rank starts its first backward that late.
    Returns ``{"buckets": its buckets by parameter name (None when they are not lists of the module's
    parameters), "trainable": how many parameters require grad, "steps": [{"counts": its
    collectives by kind, "at_issue": gradients ready at each all-reduce, "issued_at": when each
    was issued, "ready_at": when each gradient was ready, "ready_order": the names of the
    parameters in the order their gradients were ready, "grads": the .grads flattened, or
    "missing_grad": True when a .grad is None}, ...], "params": the parameters at the end}``."""
    from torch import nn

    rank, p = dist.get_rank(), dist.get_world_size()
    model = build(spec)
    ddp = MiniDDP(model, cap)
    names = {id(q): n for n, q in model.named_parameters()}
    try:
        buckets = [[names[id(q)] for q in b] for b in ddp.buckets]
    except (AttributeError, KeyError, TypeError):
        return {"buckets": None}
    ready, ready_at, ready_order = [0], [], []
    trainable = [q for q in model.parameters() if q.requires_grad]

    def count(q):
        ready[0] += 1
        ready_at.append(time.perf_counter())
        ready_order.append(names[id(q)])

    for q in trainable:
        q.register_post_accumulate_grad_hook(count)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = x.chunk(p)[rank], y.chunk(p)[rank]
    seen = []
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(xs), ys)
        ready[0], ready_at[:], ready_order[:] = 0, [], []
        if late and step == 0 and rank == p - 1:
            time.sleep(late)
        with _Issued(ready) as log:
            loss.backward()
        if any(q.grad is None for q in trainable):
            seen.append({"missing_grad": True})
            break
        seen.append({"counts": log.counts(), "at_issue": log.at_issue,
                     "issued_at": log.issued_at, "ready_at": list(ready_at),
                     "ready_order": list(ready_order),
                     "grads": torch.cat([q.grad.detach().reshape(-1) for q in trainable])})
        opt.step()
    return {"buckets": buckets, "steps": seen, "trainable": len(trainable),
            "params": {n: q.detach().clone() for n, q in model.named_parameters()}}


@probe
def mini_ddp(answer, spec: dict, cap: float, world_size: int, x: torch.Tensor,
             y: torch.Tensor, steps: int, lr: float, late: float) -> dict:
    """``answer`` (the MiniDDP class) trained on ``world_size`` ranks (:func:`_ddp_rank`):
    ``{"ranks": [what each rank observed]}``, or ``{"failure": message}``."""
    return _ranks(_ddp_rank, world_size, answer, spec, cap, x, y, steps, lr, late)


# ------------------------------------------------------------------- distributed.mini-fsdp
def _storages(skip: set[int]) -> dict[int, list]:
    """The tensor storages alive in this process, except those at the addresses in ``skip``:
    address -> [the largest tensor found on it, the storage's bytes]. Found through the garbage
    collector (every tensor object alive, wherever it is referenced from: a module, a closure, a
    hook), with the ``.grad`` of each leaf; a storage resized to 0 bytes holds nothing."""
    kinds, more = set(), [torch.Tensor]
    while more:  # (torch.Tensor and its subclasses, defined so far)
        kind = more.pop()
        kinds.add(kind)
        more += kind.__subclasses__()
    found: dict[int, list] = {}
    for obj in gc.get_objects():
        if type(obj) not in kinds:
            continue
        try:
            for t in (obj, obj.grad if obj.is_leaf else None):
                if t is None:
                    continue
                if type(t.numel()) is not int:  # (a fake tensor with symbolic sizes, left
                    continue  # alive by a compile: no memory, and its ShapeEnv may be gone)
                storage = t.untyped_storage()
                at, nbytes = storage.data_ptr(), storage.nbytes()
                if nbytes and at not in skip and (at not in found
                                                  or t.numel() > found[at][0].numel()):
                    found[at] = [t, nbytes]
        except (RuntimeError, NotImplementedError, TypeError):  # (no storage: sparse, subclass)
            continue
    return found


def _address(t) -> int | None:
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) else None


#: a collective's Work holds its tensors a moment after the call has returned (gloo's worker
#: thread drops it after waking the caller), and a reference cycle until the garbage collector
#: runs: where :func:`_alive` finds tensors besides the shard and its gradient, it collects and
#: looks again ALIVE_WAIT seconds later, until it finds the same twice (at most ALIVE_TRIES
#: looks)
ALIVE_TRIES, ALIVE_WAIT = 10, 0.2


def _alive(fsdp, skip: set[int]) -> list[list]:
    """What :func:`_storages` finds beyond ``skip``, as ``[role, dtype, shape, bytes]`` rows:
    role ``"shard"`` (the storage of ``fsdp.shard``), ``"grad"`` (of ``fsdp.shard.grad``) or
    ``"other"``; shape that of the largest tensor seen on the storage; bytes the storage's."""
    shard = getattr(fsdp, "shard", None)
    roles = {_address(shard): "shard"}
    if isinstance(shard, torch.Tensor) and shard.grad is not None:
        roles[_address(shard.grad)] = "grad"

    def others(rows: list[list]) -> list[list]:
        return sorted(row for row in rows if row[0] == "other")

    rows = []
    for _ in range(ALIVE_TRIES):
        before, rows = rows, [[roles.get(at, "other"), str(t.dtype).removeprefix("torch."),
                               list(t.shape), nbytes]
                              for at, (t, nbytes) in _storages(skip).items()]
        if not others(rows) or (before and others(rows) == others(before)):
            break  # (nothing besides the shard and its gradient, or the same twice)
        time.sleep(ALIVE_WAIT)
        gc.collect()  # (and what only a reference cycle still holds is freed)
    return rows


def _fsdp_built(MiniFSDP, spec: dict) -> dict:
    """On every rank: ``MiniFSDP(model)`` of a model built from ``spec``; ``{"type": the type
    of its ``shard``, "shard": a copy of it (None when not a tensor), "alive": the tensors this
    rank holds besides what it held before building the model (:func:`_alive`)}``."""
    keep = _storages(set())  # (kept alive, so that no new storage takes one of their addresses)
    fsdp = MiniFSDP(build(spec))
    alive = _alive(fsdp, set(keep))
    shard = getattr(fsdp, "shard", None)
    return {"type": type(shard).__name__, "alive": alive,
            "shard": shard.detach().clone() if isinstance(shard, torch.Tensor) else None}


def _fsdp_trained(MiniFSDP, spec: dict, x: torch.Tensor, y: torch.Tensor, steps: int,
                  lr: float) -> dict:
    """On every rank: ``steps`` steps of SGD (``lr``, MSE loss) on ``MiniFSDP(model).shard``
    with this rank's slice of (x, y). ``{"steps": [{"forward", "backward": the collectives
    issued in forward and in backward, by kind, "grad": a copy of ``shard.grad`` after backward
    (None when it is None), "alive": the tensors this rank holds then (:func:`_alive`: the
    output and the loss freed)}, ...]}``, ending early at a step whose ``shard.grad`` is None."""
    from torch import nn

    rank, p = dist.get_rank(), dist.get_world_size()
    xs, ys = x.chunk(p)[rank], y.chunk(p)[rank]
    keep = _storages(set())
    skip = set(keep)
    fsdp = MiniFSDP(build(spec))
    seen = []
    for _ in range(steps):
        with CommLog() as forward:
            out = fsdp(xs)
        loss = nn.functional.mse_loss(out, ys)
        with CommLog() as backward:
            loss.backward()
        del out, loss  # (and with them the autograd graph)
        step = {"forward": forward.counts(), "backward": backward.counts(),
                "alive": _alive(fsdp, skip), "grad": None}
        seen.append(step)
        if fsdp.shard.grad is None:
            break
        step["grad"] = fsdp.shard.grad.detach().clone()
        skip.add(_address(step["grad"]))
        with torch.no_grad():  # (torch.optim.SGD's step, without importing what it imports)
            fsdp.shard -= lr * fsdp.shard.grad
        fsdp.shard.grad = None
    return {"steps": seen}


@probe
def mini_fsdp(answer, spec: dict, world_size: int, x: torch.Tensor, y: torch.Tensor,
              steps: int, lr: float) -> dict:
    """``answer`` (the MiniFSDP class) on ``world_size`` ranks, twice: built
    (:func:`_fsdp_built`), then trained (:func:`_fsdp_trained`), each a reply of
    :func:`_ranks`, as ``{"built": ..., "trained": ...}`` (no ``trained`` where building
    failed). Two worlds, so that what the ranks built is seen even where training cannot run."""
    built = _ranks(_fsdp_built, world_size, answer, spec)
    if "ranks" not in built:
        return {"built": built}
    return {"built": built, "trained": _ranks(_fsdp_trained, world_size, answer, spec, x, y,
                                              steps, lr)}


# ------------------------------------------------------------------- distributed.comm-hook
def accumulate(hook, spec: dict, cap: float, x: torch.Tensor, y: torch.Tensor, lr: float,
               state: str, as_view: bool, late: float) -> dict:
    """On every rank: ``DistributedDataParallel(build(spec), bucket_cap_mb=cap,
    gradient_as_bucket_view=as_view)`` with ``hook`` registered as its comm hook (None: DDP's
    own all-reduce; ``state`` "none" registers it with ``None``, "world" with
    ``dist.group.WORLD``), trained with SGD (``lr``, MSE loss) and gradient accumulation.
    ``x``: (steps, k, p * b, in) float32, ``y``: (steps, k, p * b, out): step ``s`` runs ``k``
    micro-batches, each on this rank's chunk of ``x[s, m]``, the first ``k - 1`` backwards
    under ``ddp.no_sync()`` and the last synced, then one SGD step. With ``late`` (s) the last
    rank starts its first synced backward that late.

    Returns ``{"backwards": [one per backward, in order: {"synced": bool, "calls": [the bucket
    index of each hook call], "seconds": [how long each call took, s], "values": [[dtype, shape]
    of each returned future's value, or [type name, None]], "comms": [[kind, bytes] of each
    c10d op], "dtypes": [the dtype of each all-reduced tensor], "grads": the .grads of the
    parameters that require grad, flattened (float32), after a synced backward, else None}]}``.
    (torch/nn/parallel/distributed.py: DistributedDataParallel.no_sync, register_comm_hook.)"""
    from torch import nn

    rank, p = dist.get_rank(), dist.get_world_size()
    model = build(spec)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap,
                                              gradient_as_bucket_view=as_view)
    calls, seconds, futures = [], [], []
    if hook is not None:
        def counted(process_group, bucket):  # (DDP asks for a parameter named `bucket`,
            # unannotated or annotated dist.GradBucket: this module's annotations are text)
            start = time.perf_counter()
            future = hook(process_group, bucket)
            seconds.append(time.perf_counter() - start)
            calls.append(bucket.index())
            futures.append(future)
            return future

        ddp.register_comm_hook(dist.group.WORLD if state == "world" else None, counted)
    trainable = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    seen, steps, k = [], x.shape[0], x.shape[1]
    for s in range(steps):
        opt.zero_grad()
        for m in range(k):
            synced = m == k - 1
            calls.clear(), seconds.clear(), futures.clear()
            xs, ys = x[s, m].chunk(p)[rank], y[s, m].chunk(p)[rank]
            with contextlib.nullcontext() if synced else ddp.no_sync():
                loss = nn.functional.mse_loss(ddp(xs), ys)
            if late and synced and s == 0 and rank == p - 1:
                time.sleep(late)
            with CommLog() as log:
                loss.backward()
            values = []
            for f in futures:
                # (what .then() returns is a torch._C.Future, torch.futures.Future's base)
                v = f.value() if isinstance(f, torch._C.Future) and f.done() else f
                values.append([str(v.dtype), list(v.shape)] if isinstance(v, torch.Tensor)
                              else [type(v).__name__, None])
            seen.append({"synced": synced, "calls": list(calls), "seconds": list(seconds),
                         "values": values, "comms": [[c.kind, c.bytes] for c in log.comms],
                         "dtypes": [d for c in log.comms if c.kind == "all_reduce"
                                    for d in c.dtypes], "grads": torch.cat(
                             [q.grad.detach().reshape(-1).float() for q in trainable])
                         if synced and all(q.grad is not None for q in trainable) else None})
        opt.step()
    return {"backwards": seen}


@probe
def comm_hook(answer, spec: dict, cap: float, world_size: int, x: torch.Tensor,
              y: torch.Tensor, lr: float, state: str, as_view: bool, late: float) -> dict:
    """``answer`` (a comm hook) registered with real DDP on ``world_size`` ranks and trained with
    gradient accumulation (:func:`accumulate`): ``{"ranks": [what each rank observed]}``, or
    ``{"failure": message}``."""
    return _ranks(accumulate, world_size, answer, spec, cap, x, y, lr, state, as_view, late)
