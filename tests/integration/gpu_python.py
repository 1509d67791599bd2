"""gpu_python: one rank of a W-rank job whose gradients are PyTorch CUDA tensors (the caching
allocator's memory), registered with gradlane.Client.register_device_tensor and posted through
the daemons straight after PyTorch computed them (no synchronize); every result, read back from
device memory, must equal bit for bit the rank-ordered f32 sum of every rank's values (f16/bf16
rounded once), for several iterations.
Run by gpu_python.sh (suite gpu), one process per rank.

    gpu_python.py RANK WORLD SOCKET PEERS ITERATIONS
"""
import sys
import time

import torch

import gradlane

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SIZES = [1, 3, 1023, 65537, 1 << 20, 3_000_001]


def values(rank, tensor_index, iteration, n, dtype):
    # Exactly representable in every dtype, different per rank/tensor/iteration, some negative.
    g = torch.Generator().manual_seed(1000 * iteration + 10 * tensor_index + rank)
    return (torch.randint(-64, 64, (n,), generator=g).to(torch.float32) / 8).to(dtype)


def main():
    rank, world, sock, peers, iters = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                       sys.argv[4].split(","), int(sys.argv[5]))
    assert torch.cuda.is_available(), "gpu_python.sh runs this only where torch sees a GPU"
    dev = torch.device("cuda", 0)
    specs = [(name, size) for name in DTYPES for size in SIZES]
    arena = sum((n * DTYPES[d].itemsize + 4095) // 4096 * 4096 for d, n in specs) + (8 << 20)
    with gradlane.Client(sock, arena_bytes=arena, timeout_ms=60000) as c:
        c.register_job("gpu-python", rank=rank, world_size=world, peers=peers,
                       auth_token="gpu-python")
        grads = []
        for i, (d, n) in enumerate(specs):
            t = torch.zeros(n, dtype=DTYPES[d], device=dev)
            h = c.register_device_tensor(f"t{i}.{d}.{n}", t.data_ptr(),
                                         t.numel() * t.element_size(), dtype=d, priority=i)
            grads.append((h, t, d, n))
        for k in range(iters):
            for i, (h, t, d, n) in enumerate(grads):
                t.copy_(values(rank, i, k, n, t.dtype).to(dev))
            # No synchronize: the values were computed on PyTorch's default stream (the legacy
            # stream 0, the .to() copy from pageable memory included), and gl_post's copy is
            # ordered after that stream's work (docs/gpu.md).
            for h, t, d, n in grads:
                while not c.post(h.id, iteration=k):
                    time.sleep(1e-4)
            left = len(grads)
            while left:
                for comp in c.wait(timeout_ms=60000):
                    assert comp.ok, f"rank {rank}: {gradlane.STATUS_NAMES.get(comp.status)}"
                    left -= 1
            for i, (h, t, d, n) in enumerate(grads):
                want = torch.zeros(n, dtype=torch.float32)
                for r in range(world):
                    want += values(r, i, k, n, t.dtype).to(torch.float32)
                got = t.cpu()
                if not torch.equal(got, want.to(t.dtype)):
                    bad = (got.to(torch.float32) != want.to(t.dtype).to(torch.float32)).nonzero()
                    raise SystemExit(f"rank {rank} iteration {k}: {d}[{n}] differs at "
                                     f"{bad[:5].flatten().tolist()}")
    print(f"gpu_python rank {rank}: {iters} iterations x {len(specs)} CUDA tensors bit-exact")


if __name__ == "__main__":
    main()
