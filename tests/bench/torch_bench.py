"""torch_bench.py — one rank of the training benchmark: ResNet-18 (CIFAR-style, 32x32 inputs,
synthetic data) through DDP + gloo (stock all-reduce) or through gradlane.torch. Run by
torch_bench.sh, which starts the ranks in shaped network namespaces.

    torch_bench.py ddp --rank R --world W --master HOST:PORT --iterations N --batch B --out F
    torch_bench.py gradlane --rank R --world W --job J --peers A,B,C --socket S --policy P ...
    torch_bench.py local --rank R --world W ...   (no communication: the compute floor)
    torch_bench.py c10d --rank R --world W --master HOST:PORT ...   (DDP over gradlane.c10d)

Writes a JSON file: per-iteration wall times (after --warmup), losses, and for gradlane the
seconds each layer's forward waited for its update (forward stall)."""
import argparse
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 inputs (3x3 stem, no max-pool): 11.2 M parameters, 62 tensors."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["ddp", "gradlane", "local", "c10d"])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--job", default="bench")
    ap.add_argument("--peers", default="")
    ap.add_argument("--socket")
    ap.add_argument("--policy")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.rank)
    model = ResNet18()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    trainer = None
    if args.mode == "local":  # no communication: the compute each rank has on this machine
        net = model
    elif args.mode in ("ddp", "c10d"):
        host, port = args.master.rsplit(":", 1)
        backend = "gloo"
        if args.mode == "c10d":  # unchanged DDP over the gradlane backend
            import gradlane.c10d  # noqa: F401
            backend = "gradlane"
        torch.distributed.init_process_group(backend, init_method=f"tcp://{host}:{port}",
                                             rank=args.rank, world_size=args.world)
        net = torch.nn.parallel.DistributedDataParallel(model)
    else:
        import gradlane.torch as gltorch
        trainer = gltorch.distribute(model, opt, job_id=args.job, rank=args.rank,
                                     world_size=args.world, peers=args.peers.split(","),
                                     policy=args.policy, socket_path=args.socket)
        net = model
    g = torch.Generator().manual_seed(100 + args.rank)
    x = torch.randn(args.batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    times, losses = [], []
    compute = []
    last = time.perf_counter()
    for it in range(args.warmup + args.iterations):
        if it == args.warmup and trainer is not None:
            trainer.forward_stall_s.clear()
        opt.zero_grad()
        t0 = time.perf_counter()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        t1 = time.perf_counter()
        opt.step()
        losses.append(loss.item())
        now = time.perf_counter()
        if it >= args.warmup:
            times.append(now - last)
            compute.append(t1 - t0)
        last = now
    if trainer is not None:
        trainer.synchronize()
    result = {"mode": args.mode, "policy": args.policy or "", "rank": args.rank,
              "iteration_s": times, "forward_backward_s": compute, "losses": losses,
              "forward_stall_s": dict(trainer.forward_stall_s) if trainer else {},
              "parameters": sum(p.numel() for p in model.parameters())}
    with open(args.out, "w") as f:
        json.dump(result, f)
    if trainer is not None:
        trainer.close()
    elif args.mode in ("ddp", "c10d"):
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
