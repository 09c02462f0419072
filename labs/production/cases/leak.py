"""Train a small regression MLP and log a validation loss every step. Each step also records
the bytes the C allocator (malloc) has handed out and not yet got back, which is where torch's
CPU tensors live. Run it from a terminal with `python leak.py` (Linux, glibc); `main(config)`
returns the losses and the memory readings."""

import ctypes
import json

import torch
from torch import nn

DEFAULTS = {"seed": 0, "steps": 30, "lr": 0.05, "batch": 64, "val_batch": 512,
            "features": 32, "hidden": 256}


class MallInfo2(ctypes.Structure):
    """glibc's `struct mallinfo2` (man 3 mallinfo2)."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2


def allocated_bytes():
    """Bytes malloc has handed out and not got back: in its heaps, plus its mmapped blocks."""
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def main(config):
    config = {**DEFAULTS, **config}
    torch.manual_seed(config["seed"])
    features, hidden = config["features"], config["hidden"]
    true_w = torch.randn(features, 1)
    val_x = torch.randn(config["val_batch"], features)
    val_y = val_x @ true_w
    model = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(),
                          nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loss_fn = nn.MSELoss()
    train_losses, val_losses, memory = [], [], []
    for step in range(config["steps"]):
        x = torch.randn(config["batch"], features)
        loss = loss_fn(model(x), x @ true_w)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        train_losses.append(loss.item())

        val_loss = loss_fn(model(val_x), val_y)
        val_losses.append(val_loss)
        memory.append(allocated_bytes())
    return {"train_losses": train_losses,
            "val_losses": [v.item() for v in val_losses],
            "memory": memory}


if __name__ == "__main__":
    print(json.dumps(main({})))
