"""torch_c10d_ops.py — one rank of the c10d backend's collective checks (torch_exact.sh):

    torch_c10d_ops.py RANK WORLD MASTER_HOST:PORT

Every rank computes what every collective must give and compares bit for bit:
allreduce SUM of float32 (rank-ordered), float16, int64 and bool, AVG; broadcast of float32
with -0.0 and NaN-free bit patterns, of float64 and int64 (the byte path), from rank 1;
allgather and _allgather_base of mixed dtypes; barrier; and clear errors for MAX, float64
allreduce and integers beyond 2^24. Exit 0 only if all hold."""
import sys

import torch
import torch.distributed as dist

import gradlane.c10d  # noqa: F401 — registers the backend

rank, world, master = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gradlane", init_method=f"tcp://{master}", rank=rank, world_size=world)
failed = []


def check(name, ok):
    print(("ok   " if ok else "FAIL ") + name, flush=True)
    if not ok:
        failed.append(name)


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def data(r, dtype=torch.float32, n=1000):
    g = torch.Generator().manual_seed(17 + r)
    return torch.randn(n, generator=g).to(dtype)


# allreduce SUM in rank order, float32: 5M elements take two rounds of the largest rung.
for n in (1, 1000, 5 * 1024 * 1024 + 3):
    t = data(rank, n=n)
    dist.all_reduce(t)
    want = data(0, n=n).clone()
    for r in range(1, world):
        want += data(r, n=n)
    check(f"allreduce float32 x{n} == rank-ordered sum", bits_equal(t, want))
t = data(rank, torch.float16)
dist.all_reduce(t)
want = data(0, torch.float16).float()
for r in range(1, world):
    want += data(r, torch.float16).float()
check("allreduce float16 == float32 sum rounded once", bits_equal(t, want.half()))
t = torch.arange(10, dtype=torch.int64) * (rank + 1)
dist.all_reduce(t)
check("allreduce int64", torch.equal(t, torch.arange(10) * sum(range(1, world + 1))))
t = torch.tensor([rank == 0, False, True])
dist.all_reduce(t)
check("allreduce bool (any)", t.tolist() == [True, False, True])
t = data(rank)
dist.all_reduce(t, op=dist.ReduceOp.AVG)
want = data(0).clone()
for r in range(1, world):
    want += data(r)
check("allreduce AVG == sum / W", bits_equal(t, want / world))

# broadcast from rank 1, bit for bit, through the value and the byte paths.
src = torch.tensor([-0.0, 0.0, 1e-45, 3.4e38, -2.5], dtype=torch.float32)
t = src.clone() if rank == 1 else torch.full_like(src, 7.0)
dist.broadcast(t, src=1)
check("broadcast float32 (-0.0, subnormal, huge)", bits_equal(t, src))
src64 = torch.tensor([1 / 3, -0.0, 1e300], dtype=torch.float64)
t = src64.clone() if rank == 1 else torch.zeros_like(src64)
dist.broadcast(t, src=1)
check("broadcast float64 (byte path)", bits_equal(t, src64))
srci = torch.tensor([-1, 2 ** 62, 0], dtype=torch.int64)
t = srci.clone() if rank == 1 else torch.zeros_like(srci)
dist.broadcast(t, src=1)
check("broadcast int64 (-1 and 2^62: byte path)", torch.equal(t, srci))

# allgather
outs = [torch.empty(4, dtype=torch.int32) for _ in range(world)]
dist.all_gather(outs, torch.full((4,), rank * 1000 - 1, dtype=torch.int32))
check("allgather int32", all(torch.equal(o, torch.full((4,), r * 1000 - 1, dtype=torch.int32))
                             for r, o in enumerate(outs)))
outs = [torch.empty(3) for _ in range(world)]
dist.all_gather(outs, data(rank, n=3))
check("allgather float32", all(bits_equal(o, data(r, n=3)) for r, o in enumerate(outs)))
dist.barrier()
check("barrier", True)


def expect_error(name, fn, needle):
    try:
        fn()
    except RuntimeError as e:
        check(f"{name}: {str(e).splitlines()[0][:120]}", needle in str(e))
        return
    check(f"{name}: no error", False)


expect_error("allreduce MAX", lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.MAX),
             "not supported")
expect_error("allreduce float64", lambda: dist.all_reduce(torch.ones(2, dtype=torch.float64)),
             "float64")
expect_error("allreduce int beyond 2^24",
             lambda: dist.all_reduce(torch.tensor([2 ** 25], dtype=torch.int64)), "2^24")
dist.barrier()  # every rank refused locally; the job still runs
dist.destroy_process_group()
print(f"rank {rank}: {'FAILED: ' + ', '.join(failed) if failed else 'all collective checks hold'}")
sys.exit(1 if failed else 0)
