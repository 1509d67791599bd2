#!/usr/bin/env bash
# gpu_exact: tensors in the memory of a real GPU (GPU 0, the NVIDIA driver's libcuda.so.1)
# through three daemons, bit-exact for f32/f16/bf16, in parameter-server and all-reduce mode,
# staged through the arena; where the host has an RDMA NIC too, once more over verbs with the
# GPU memory registered with the NIC (GPUDirect). Skips (77) saying why where there is no GPU
# or no driver.
#   gpu_exact.sh GRADLANED GRADLANE-CHECK        (meson test -C build --suite gpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check=$2
unset GRADLANE_CUDA_LIBRARY  # the real driver, never a fake
if ! probe=$("$check" --probe_device); then
  echo "SKIP: needs an NVIDIA GPU and its driver (libcuda.so.1): $probe"
  exit 77
fi
echo "$probe"
export IT_CHECK_EXTRA=--device=cuda IT_ITERATIONS=${IT_ITERATIONS:-20}
export IT_POLICIES=${IT_POLICIES:-"fifo bytescheduler gradlane"}
bash "$here/ps_exact.sh" "$@"
bash "$here/allreduce_exact.sh" "$@"
# GPUDirect: on a host that also has an RDMA NIC, the parameter-server run again over verbs, with
# the GPU memory registered with the NIC (dma-buf); pushes and pulled results then go NIC <-> GPU.
# A NIC, not a software device (soft-RoCE and siw have no dma-buf memory regions), with an
# active port; the daemons open the first device (GL_VERBS_FLAGS may name another).
nic=$(ibv_devinfo 2>/dev/null | awk '/^hca_id:/ {dev = $2} /state:[[:space:]]+PORT_ACTIVE/ && dev !~ /^(rxe|siw)/ {print dev; exit}' || true)
if [[ -n $nic ]]; then
  echo "gpu_exact: GPUDirect over verbs on $nic"
  GL_FORCE_LOOPBACK=1 GL_TRANSPORT=verbs IT_POLICIES=gradlane IT_EXPECT_GPUDIRECT=1 \
    bash "$here/ps_exact.sh" "$@"
else
  echo "gpu_exact: GPUDirect over verbs not checked: needs an RDMA NIC with an active port on this host (ibv_devinfo shows none)"
fi
echo "gpu_exact: ok"
