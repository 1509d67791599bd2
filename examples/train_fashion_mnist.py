"""Data-parallel training of a small CNN on Fashion-MNIST through gradlane.torch.

One process per host, next to that host's gradlaned (`systemctl start gradlaned`):

    GRADLANE_JOB=fmnist RANK=0 WORLD_SIZE=3 \
    GRADLANE_PEERS=10.0.0.1:7600,10.0.0.2:7600,10.0.0.3:7600 \
        python3 examples/train_fashion_mnist.py

GRADLANE_PEERS lists every rank's daemon (its --listen address) in rank order; GRADLANE_POLICY
(default: the daemon's) and GRADLANE_SOCKET (default /run/gradlane/gradlaned.sock) are
optional. The lines marked "gradlane" are the whole difference from the DDP version of this
script (docs/training.md shows the diff). Needs Debian's python3-torch and
dataset-fashion-mnist.
"""
import gzip
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

import gradlane.torch as gltorch                       # gradlane (DDP: torch.distributed)

DATA = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


def load(kind="train"):
    with gzip.open(f"{DATA}/{kind}-images-idx3-ubyte.gz") as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).view(n, 1, rows, cols)
    with gzip.open(f"{DATA}/{kind}-labels-idx1-ubyte.gz") as f:
        f.read(8)
        y = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    return x.float().div_(255.0), y


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=500, gamma=0.5)
    trainer = gltorch.distribute(model, optimizer)     # gradlane (DDP: model = DDP(model))

    x, y = load("train")
    batch = 64
    per_step = batch * world
    for epoch in range(2):
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(epoch))
        for step in range(x.shape[0] // per_step):
            idx = perm[step * per_step + rank * batch:step * per_step + (rank + 1) * batch]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 100 == 0 and rank == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
        trainer.synchronize()                          # gradlane: before evaluating
        model.eval()
        tx, ty = load("t10k")
        with torch.no_grad():
            acc = (model(tx).argmax(1) == ty).float().mean().item()
        model.train()
        if rank == 0:
            print(f"epoch {epoch}: test accuracy {acc:.4f}", flush=True)
    trainer.close()                                    # gradlane


if __name__ == "__main__":
    main()
