#!/usr/bin/env bash
# gpu_python: PyTorch CUDA tensors through the Python binding and three daemons (gpu_python.py):
# bit-exact results back in device memory. Skips (77) saying why without a python3 whose torch
# sees a GPU.
#   gpu_python.sh GRADLANED LIBGRADLANE PYTHON_PACKAGE_DIR     (meson test -C build --suite gpu)
set -euo pipefail
source "$(dirname "$0")/gpu_torch_env.sh"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=10s; done
peers=$(gl_peers)
for r in 0 1 2; do
  gl_bg "$r" "py.r$r" "$py" "$here/gpu_python.py" "$r" 3 "${GL_SOCK[r]}" "$peers" "${IT_ITERATIONS:-5}"
done
for r in 0 1 2; do
  gl_wait "py.r$r" 300 || { gl_show "py.r$r" 30; echo "FAIL: rank $r" >&2; exit 1; }
  cat "$GL_TMP/py.r$r.out"
done
echo "gpu_python: ok"
