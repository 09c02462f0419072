"""Train a small classifier on noisy synthetic data: an MLP, SGD with momentum, and a
cross entropy written out by hand from its textbook definition. Run it from a terminal with
`python nan.py`; `main(config)` returns the loss of every step."""

import json

import torch
from torch import nn
from torch.nn import functional as F

DEFAULTS = {"seed": 0, "steps": 60, "lr": 1.0, "batch": 64, "examples": 512,
            "features": 16, "hidden": 64, "classes": 5, "label_noise": 0.1}


def make_data(config):
    """Points whose label is the largest of a few random projections; some labels flipped."""
    g = torch.Generator().manual_seed(config["seed"])
    n, classes = config["examples"], config["classes"]
    x = torch.randn(n, config["features"], generator=g)
    y = (x @ torch.randn(config["features"], classes, generator=g)).argmax(-1)
    flip = torch.rand(n, generator=g) < config["label_noise"]
    return x, torch.where(flip, torch.randint(0, classes, (n,), generator=g), y)


def cross_entropy(logits, target):
    """Mean over the batch of -sum_c onehot_c * log p_c, with p = softmax(logits)."""
    probs = torch.softmax(logits, dim=-1)
    onehot = F.one_hot(target, logits.shape[-1]).float()
    return -(onehot * torch.log(probs)).sum(dim=-1).mean()


def main(config):
    config = {**DEFAULTS, **config}
    torch.manual_seed(config["seed"])
    x, y = make_data(config)
    model = nn.Sequential(nn.Linear(config["features"], config["hidden"]), nn.ReLU(),
                          nn.Linear(config["hidden"], config["classes"]))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    losses = []
    for step in range(config["steps"]):
        batch = torch.arange(step * config["batch"], (step + 1) * config["batch"])
        batch = batch % config["examples"]
        loss = cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses}


if __name__ == "__main__":
    print(json.dumps(main({})))
