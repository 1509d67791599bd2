# tests/integration/gpu_torch_env.sh — what gpu_python.sh and gpu_torch.sh share, sourced with
# their arguments GRADLANED LIBGRADLANE PYTHON_PACKAGE_DIR: netns.sh, GL_DAEMON, the library and
# package for python, the real CUDA driver, and $py, a python3 whose torch sees a GPU (exits 77
# saying why where there is none). GL_TORCH_PYTHON names one to try first.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
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
