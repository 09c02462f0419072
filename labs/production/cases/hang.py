"""Data-parallel training on two CPU ranks (gloo). Each rank trains a copy of the same model on
its own shard of the data and averages the gradients with all_reduce after every backward, so
that the copies stay equal. Now and then storage hands back a corrupted label (NaN): the rank
that reads it skips that step. main forks the ranks, waits for them (never longer than the
collectives' timeout and a margin) and returns what each rank left."""
import json
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

# seed: the data's and the model's; corrupt: the chance that a label comes back as NaN;
# skip: steps every rank skips, told in advance (e.g. batches a data audit flagged);
# timeout_s: how long a rank waits in a collective; workdir: where the ranks meet
DEFAULTS = {"seed": 0, "steps": 8, "batch": 16, "lr": 0.05, "corrupt": 0.005, "skip": [],
            "timeout_s": 2.0, "workdir": tempfile.gettempdir()}
WORLD = 2


def shard(rank, config):
    """This rank's batches as read from storage: now and then a label comes back as NaN."""
    g = torch.Generator().manual_seed(1000 * config["seed"] + rank)
    x = torch.randn(config["steps"], config["batch"], 8, generator=g)
    y = x.sum(-1, keepdim=True).sin()
    y[torch.rand(y.shape, generator=g) < config["corrupt"]] = float("nan")
    return x, y


def train(rank, config, store_path):
    torch.manual_seed(config["seed"])  # the same initial model on every rank
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    xs, ys = shard(rank, config)
    store = dist.FileStore(store_path, WORLD)  # where the ranks meet: a file both can read
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=config["timeout_s"]))
    losses = []
    for step in range(config["steps"]):
        if step in config["skip"]:
            continue  # a step the job was told to skip: every rank skips it
        loss = nn.functional.mse_loss(model(xs[step]), ys[step])
        if not torch.isfinite(loss):
            continue  # a corrupted batch: skip this step
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= WORLD
        opt.step()
        losses.append(loss.item())
    dist.barrier()  # every rank done before the group goes
    dist.destroy_process_group()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    return {"losses": losses, "params": params}


def rank_main(rank, config, folder):
    try:
        result = {"status": "ok", **train(rank, config, os.path.join(folder, "store"))}
    except Exception as exc:  # noqa: BLE001  (what the rank raised is its result)
        result = {"status": "raised", "error": f"{type(exc).__name__}: {exc}"}
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def main(config):
    config = {**DEFAULTS, **config}
    folder = tempfile.mkdtemp(dir=config["workdir"])
    pids = {}
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            rank_main(rank, config, folder)
            os._exit(0)
        pids[rank] = pid
    deadline = time.monotonic() + config["timeout_s"] + 10
    while pids and time.monotonic() < deadline:
        for rank, pid in list(pids.items()):
            if os.waitpid(pid, os.WNOHANG)[0]:
                del pids[rank]
        time.sleep(0.01)
    for pid in pids.values():  # still running past the deadline: killed
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    ranks = []
    for rank in range(WORLD):
        path = os.path.join(folder, f"rank{rank}.json")
        if os.path.exists(path) and os.path.getsize(path) > 0:
            with open(path) as f:
                ranks.append(json.load(f))
        else:
            ranks.append({"status": "killed"})
    return {"ranks": ranks}


if __name__ == "__main__":
    print(json.dumps(main({})))
