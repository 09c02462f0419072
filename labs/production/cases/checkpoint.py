"""Training with checkpoints: a small regression model with dropout, trained with AdamW and a
step-decayed learning rate on a shuffled DataLoader. A job may be stopped after step
`stop_at` (a preemption): it saves a checkpoint in `workdir` first. A job started with
`resume` loads it and carries on, so stopped + resumed should train exactly as one run."""
import json
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEFAULTS = {"seed": 0, "items": 48, "batch": 8, "epochs": 3, "lr": 0.01, "decay_every": 4,
            "stop_at": None, "resume": False, "workdir": tempfile.gettempdir()}


def main(config):
    config = {**DEFAULTS, **config}
    path = os.path.join(config["workdir"], "checkpoint.pt")
    torch.manual_seed(config["seed"])
    x = torch.randn(config["items"], 6)
    data = TensorDataset(x, x.sin().sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=config["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(config["seed"]))
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=config["decay_every"], gamma=0.5)
    step = 0
    if config["resume"]:
        checkpoint = torch.load(path)
        model.load_state_dict(checkpoint["model"])
        opt.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"])
        step = checkpoint["step"]
    start, losses = step, []
    for epoch in range(step // len(loader), config["epochs"]):  # from the epoch it stopped in
        for i, (inputs, targets) in enumerate(loader):
            if epoch * len(loader) + i < step:
                continue  # trained on before the checkpoint
            loss = nn.functional.mse_loss(model(inputs), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            step += 1
            if step == config["stop_at"]:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "rng": torch.get_rng_state(), "step": step}, path)
                return {"start": start, "losses": losses, "params": params(model)}
    return {"start": start, "losses": losses, "params": params(model)}


def params(model):
    return [p.detach().flatten().tolist() for p in model.parameters()]


if __name__ == "__main__":
    print(json.dumps(main({})))
