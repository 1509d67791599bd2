#!/usr/bin/env bash
# gpu_exact: tensors in the memory of a real GPU (GPU 0, the NVIDIA driver's libcuda.so.1)
# through three daemons, bit-exact for f32/f16/bf16, in parameter-server and all-reduce mode,
# staged through the arena. Skips (77) saying why where there is no GPU or no driver.
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
echo "gpu_exact: ok"
