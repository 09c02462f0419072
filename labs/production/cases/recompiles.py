"""Train a small classifier with label smoothing that decays in steps (a staircase schedule),
its loss computed by a compiled function. `backend="eager"` runs the graphs Dynamo captures
as they are (no code generation), so a compile costs only Dynamo's own work. Run it from a
terminal with `python recompiles.py`; `main(config)` returns the losses and each step's time
(`case.run` counts the graphs Dynamo compiled during the run: its `graphs`)."""

import json
import time

import torch
from torch import nn
from torch.nn import functional as F

# smoothing, decay, every: the label smoothing starts at `smoothing` and is multiplied by
# `decay` every `every` steps (decay 1.0: a constant smoothing); compile: the loss compiled
DEFAULTS = {"seed": 0, "steps": 30, "lr": 0.1, "batch": 32, "features": 16, "hidden": 32,
            "classes": 4, "smoothing": 0.2, "decay": 0.7, "every": 3, "compile": True}


def smoothing_at(step, config):
    """The label smoothing of `step`: `smoothing * decay ** (step // every)`."""
    return config["smoothing"] * config["decay"] ** (step // config["every"])


def compute_loss(model, x, y, smoothing):
    return F.cross_entropy(model(x), y, label_smoothing=smoothing)


def main(config):
    config = {**DEFAULTS, **config}
    torch.manual_seed(config["seed"])
    model = nn.Sequential(nn.Linear(config["features"], config["hidden"]), nn.ReLU(),
                          nn.Linear(config["hidden"], config["classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loss_fn = compute_loss
    if config["compile"]:
        loss_fn = torch.compile(compute_loss, backend="eager")
    losses, step_ms = [], []
    for step in range(config["steps"]):
        x = torch.randn(config["batch"], config["features"])
        y = (x[:, : config["classes"]]).argmax(-1)
        start = time.perf_counter()
        loss = loss_fn(model, x, y, smoothing_at(step, config))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_ms.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
    return {"losses": losses, "step_ms": step_ms}


if __name__ == "__main__":
    print(json.dumps(main({})))
