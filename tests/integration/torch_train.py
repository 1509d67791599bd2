"""torch_train.py — one rank of a small CNN trained on Fashion-MNIST, through gradlane.torch or
through DDP over gloo; and the comparison of two runs. Used by torch_exact.sh.

    torch_train.py gradlane --rank R --world W --job J --peers A,B,C --socket S --policy P
                   --optimizer O --iterations N --out FILE [--progress_file F]
    torch_train.py ddp --rank R --world W --master HOST:PORT --optimizer O --iterations N --out F
    torch_train.py c10d --rank R --world W --master HOST:PORT ...   (DDP over the gradlane backend)
    torch_train.py compare DDP_PREFIX GRADLANE_PREFIX W [rank0|same]
    (--device cuda: the model and batches on GPU 0, deterministic kernels; gpu_torch.sh)

Both modes compute the same thing: every rank seeds its model differently (the initial
broadcast must make them equal), takes its own slice of each batch, and the gradients are the
rank-ordered sum divided by W (DDP gets a communication hook doing exactly that: gloo's own
all-reduce sums in an order of its choosing). A gradlane failure ends the process with exit
code 3 and the TrainingError on stderr (the kill -9 case); over the c10d backend, the
RuntimeError naming the gradlane backend, as "GradlaneBackendError: ..."."""
import argparse
import gzip
import os
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist")


class Net(nn.Module):
    """Conv-BN-ReLU-pool, conv-ReLU-pool, two linear layers: 2 conv + BatchNorm buffers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def load_images(n):
    with gzip.open(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")) as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        assert magic == 2051, f"not an idx3 image file (magic {magic})"
        n = min(n, count)
        images = torch.frombuffer(bytearray(f.read(n * rows * cols)), dtype=torch.uint8)
    with gzip.open(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz")) as f:
        magic, count = struct.unpack(">II", f.read(8))
        assert magic == 2049, f"not an idx1 label file (magic {magic})"
        labels = torch.frombuffer(bytearray(f.read(n)), dtype=torch.uint8).long()
    return images.view(n, 1, rows, cols).float().div_(255.0), labels


def make_optimizer(name, model):
    """One optimizer per kind the plugin must honour: plain SGD; SGD with Nesterov momentum,
    weight decay and a StepLR schedule; Adam with two param groups; AdamW."""
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05), None
    if name == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                              weight_decay=1e-4)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    if name == "adam":
        conv = [p for n, p in model.named_parameters() if n.startswith(("conv", "bn"))]
        fc = [p for n, p in model.named_parameters() if n.startswith("fc")]
        return torch.optim.Adam([{"params": conv}, {"params": fc, "lr": 5e-4}], lr=1e-3), None
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01), None
    raise SystemExit(f"unknown optimizer {name}")


def ordered_sum_hook(state, bucket):
    """DDP communication hook: the W buckets summed in rank order, then divided by W — the
    daemons' arithmetic followed by gradlane.torch's average. A GPU bucket is gathered and
    summed on the CPU (gloo gathers host tensors; the daemons add on the CPU too) and divided
    on the GPU, where gradlane.torch divides."""
    world = torch.distributed.get_world_size()
    buf = bucket.buffer()
    host = buf.cpu()
    parts = [torch.empty_like(host) for _ in range(world)]
    torch.distributed.all_gather(parts, host)
    acc = parts[0].clone()
    for t in parts[1:]:
        acc += t
    acc = acc.to(buf.device)
    acc.div_(world)
    fut = torch.futures.Future()
    fut.set_result(acc)
    return fut


def premul_ordered_sum_hook(state, bucket):
    """What DDP does with no hook over a backend that sums in rank order: each gradient times
    1/W as it is copied into the bucket (the reducer's mul_out by a wrapped scalar), then the
    rank-ordered sum. The reference for the c10d backend."""
    world = torch.distributed.get_world_size()
    buf = bucket.buffer().mul(1.0 / world)
    parts = [torch.empty_like(buf) for _ in range(world)]
    torch.distributed.all_gather(parts, buf)
    acc = parts[0].clone()
    for t in parts[1:]:
        acc += t
    fut = torch.futures.Future()
    fut.set_result(acc)
    return fut


def train(args):
    torch.set_num_threads(1)  # both modes: the same kernels, so the same floating-point sums
    dev = torch.device(args.device)
    if dev.type == "cuda":
        # The same kernels in both modes, run to run (cuBLAS needs its workspace fixed).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(1000 + args.rank)  # different on purpose: the broadcast must fix it
    model = Net().to(dev)
    opt, sched = make_optimizer(args.optimizer, model)
    world, rank, b = args.world, args.rank, args.batch
    images, labels = load_images(args.iterations * world * b if args.iterations < 10**6 else
                                 60000)
    per_iter = world * b
    trainer = None
    if args.mode in ("ddp", "c10d"):
        host, port = args.master.rsplit(":", 1)
        backend = "gloo"
        if args.mode == "c10d":
            import gradlane.c10d  # noqa: F401 — registers the backend
            backend = "gradlane"
        torch.distributed.init_process_group(backend, init_method=f"tcp://{host}:{port}",
                                             rank=rank, world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.mode == "ddp":
            net.register_comm_hook(None, premul_ordered_sum_hook if args.hook == "premul"
                                   else ordered_sum_hook)
    else:
        import gradlane.torch as gltorch
        trainer = gltorch.distribute(model, opt, job_id=args.job, rank=rank, world_size=world,
                                     peers=args.peers.split(","), policy=args.policy,
                                     socket_path=args.socket, auth_token=args.token,
                                     timeout_s=args.timeout_s)
        net = model
    losses = []
    t0 = time.monotonic()
    for it in range(args.iterations):
        start = (it * per_iter) % (images.shape[0] - per_iter + 1) + rank * b
        x, y = images[start:start + b].to(dev), labels[start:start + b].to(dev)
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
        if args.progress_file:
            with open(args.progress_file + ".tmp", "w") as f:
                f.write(str(it))
            os.replace(args.progress_file + ".tmp", args.progress_file)
        if it % 10 == 0 or it == args.iterations - 1:
            print(f"iteration {it} loss {losses[-1]:.6f}", flush=True)
    if trainer is not None:
        trainer.synchronize()
    elapsed = time.monotonic() - t0
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    torch.save({"losses": losses, "state": state}, args.out)
    if trainer is not None:
        trainer.close()
    else:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    print(f"{args.mode} rank {rank}: {args.iterations} iterations in {elapsed:.1f} s, "
          f"final loss {losses[-1]:.6f}", flush=True)


def compare(ddp_prefix, gl_prefix, world, buffers_from="rank0"):
    """Losses and parameters bit for bit, every rank; floating-point buffers of every gradlane
    rank against DDP's rank 0 (gradlane.torch broadcasts rank 0's after each forward), or
    against the same rank's (buffers_from "same": two DDP runs)."""
    ref0 = torch.load(f"{ddp_prefix}.r0.pt")
    bad = []
    for r in range(world):
        ref = torch.load(f"{ddp_prefix}.r{r}.pt")
        got = torch.load(f"{gl_prefix}.r{r}.pt")
        if len(ref["losses"]) != len(got["losses"]):
            bad.append(f"rank {r}: {len(got['losses'])} losses, DDP has {len(ref['losses'])}")
        for i, (a, g) in enumerate(zip(ref["losses"], got["losses"])):
            if a.hex() != g.hex():
                bad.append(f"rank {r}: loss of iteration {i}: DDP {a!r}, gradlane {g!r}")
                break
        for name, want in ref["state"].items():
            if want.is_floating_point() and name.startswith("bn") and buffers_from == "rank0":
                want = ref0["state"][name]
            have = got["state"][name]
            same = (want.dtype == have.dtype and want.shape == have.shape and
                    torch.equal(want.view(-1).view(torch.int32 if want.element_size() == 4 else
                                                   torch.int64),
                                have.view(-1).view(torch.int32 if have.element_size() == 4 else
                                                   torch.int64)))
            if not same:
                diff = (want.double() - have.double()).abs().max().item()
                bad.append(f"rank {r}: {name} differs (max |diff| {diff:g})")
    if bad:
        print("MISMATCH against DDP + gloo:\n  " + "\n  ".join(bad[:20]))
        return 1
    n = len(ref0["losses"])
    print(f"bit-identical to DDP + gloo: {world} ranks x {n} losses, "
          f"{len(ref0['state'])} state tensors")
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                       sys.argv[5] if len(sys.argv) > 5 else "rank0")
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["gradlane", "ddp", "c10d"])
    ap.add_argument("--hook", choices=["ordered", "premul"], default="ordered")
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--optimizer", default="momentum")
    ap.add_argument("--out", required=True)
    ap.add_argument("--master", default="127.0.0.1:29500")
    ap.add_argument("--job", default="torch")
    ap.add_argument("--peers", default="")
    ap.add_argument("--socket")
    ap.add_argument("--policy")
    ap.add_argument("--token")
    ap.add_argument("--timeout_s", type=float, default=120.0)
    ap.add_argument("--progress_file")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    try:
        train(args)
    except Exception as e:  # noqa: BLE001 — the kill case: report and exit 3
        if type(e).__name__ == "TrainingError":
            print(f"TrainingError: {e}", file=sys.stderr, flush=True)
            return 3
        if args.mode == "c10d" and "gradlane backend" in str(e):
            print(f"GradlaneBackendError: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
            return 3
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
