"""gradlane.c10d — registers the torch.distributed backend "gradlane", so an unchanged DDP
script runs its collectives over the hosts' gradlane daemons:

    import gradlane.c10d                      # the one added line
    torch.distributed.init_process_group("gradlane", rank=rank, world_size=world)
    model = DistributedDataParallel(model)    # as before

The backend (libclient/c10d, C++) takes the job's daemons from GRADLANE_PEERS (every rank's
daemon address, in rank order) or, per rank, GRADLANE_ADDRESS (its own daemon's --listen
address, exchanged through the store); GRADLANE_SOCKET, GRADLANE_POLICY and GRADLANE_TOKEN as
for gradlane.torch. It does allreduce (SUM, AVG), broadcast, allgather and barrier on CPU
tensors, synchronously: DDP over it overlaps no communication with backward and updates no
layer early, which gradlane.torch does (docs/training.md §5).

The extension module is gradlane/_c10d next to this file when installed; in a build tree,
$GRADLANE_C10D_MODULE names the built file.
"""
import importlib.util
import os

import torch.distributed as dist

__all__ = ["BACKEND"]

BACKEND = "gradlane"


def _load():
    path = os.environ.get("GRADLANE_C10D_MODULE")
    if path:
        spec = importlib.util.spec_from_file_location("gradlane._c10d", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    try:
        from gradlane import _c10d  # noqa: PLC0415 — installed beside this file
    except ImportError as e:
        raise ImportError(
            "gradlane.c10d: the backend's extension module (gradlane/_c10d) is not installed: "
            "build gradlane with meson -Dtorch=enabled (Debian: libtorch-dev, pybind11-dev, "
            "python3-dev) and install it, or set GRADLANE_C10D_MODULE to the built file") from e
    return _c10d


_c10d = _load()
if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _c10d.create_process_group)
