"""Training a small classifier on images read one by one from slow storage. Each item costs a
wait that needs no CPU (a network read, a disk seek: here `time.sleep`), then a little
decoding. The loop reads its batches from a DataLoader in the training process itself."""
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

DEFAULTS = {"seed": 0, "items": 64, "batch": 8, "read_s": 0.01, "width": 1024, "lr": 0.05,
            "workdir": "/tmp"}


class RemoteImages(Dataset):
    """Item i: a 3x16x16 image and its label, fetched from storage that answers in read_s."""

    def __init__(self, n, seed, read_s):
        self.n, self.seed, self.read_s = n, seed, read_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.read_s)  # waiting for storage
        g = torch.Generator().manual_seed(self.seed * 100_003 + i)
        image = torch.rand(3, 16, 16, generator=g)  # "decoding"
        return image, int(image.mean() > 0.5) + 2 * int(image[0].mean() > 0.5)


def main(config):
    config = {**DEFAULTS, **config}
    torch.manual_seed(config["seed"])
    data = RemoteImages(config["items"], config["seed"], config["read_s"])
    loader = DataLoader(data, batch_size=config["batch"], shuffle=True,
                        generator=torch.Generator().manual_seed(config["seed"]))
    w = config["width"]
    model = nn.Sequential(nn.Flatten(), nn.Linear(768, w), nn.ReLU(), nn.Linear(w, w),
                          nn.ReLU(), nn.Linear(w, 4))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    losses = []
    start = time.perf_counter()
    for images, labels in loader:
        loss = nn.functional.cross_entropy(model(images), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    print(json.dumps(main({})))
