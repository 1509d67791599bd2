#!/usr/bin/env bash
# gpu_python: PyTorch CUDA tensors through the Python binding and three daemons (gpu_python.py):
# bit-exact results back in device memory. Skips (77) saying why without a python3 whose torch
# sees a GPU.
#   gpu_python.sh GRADLANED LIBGRADLANE PYTHON_PACKAGE_DIR     (meson test -C build --suite gpu)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
GL_DAEMON=$1
export GRADLANE_LIB=$2 PYTHONPATH=$3
unset GRADLANE_CUDA_LIBRARY LD_PRELOAD  # the real driver; no sanitizer runtime in python
[[ -x $GL_DAEMON ]] || { echo "SKIP: gradlaned not built ($GL_DAEMON)"; exit 77; }
py=""
for cand in ${GL_TORCH_PYTHON:-} python3 /usr/bin/python3; do
  if "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    py=$(command -v "$cand"); break
  fi
done
[[ -n $py ]] || { echo "SKIP: needs a python3 whose torch sees a CUDA GPU"; exit 77; }
"$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
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
