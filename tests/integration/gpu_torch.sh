#!/usr/bin/env bash
# gpu_torch: gradlane.torch training on a GPU. Three ranks (all on GPU 0), three daemons, the
# small CNN of torch_train.py on Fashion-MNIST with deterministic kernels: DDP over gloo (a hook
# that sums the ranks' buckets in rank order and divides by W on the GPU) is the reference,
# and gradlane.torch (device gradients, posted from its poster thread after each gradient's
# CUDA event) must match it bit for bit: every loss, every parameter, for two optimizers and
# two policies.
#   gpu_torch.sh GRADLANED LIBGRADLANE PYTHON_PACKAGE_DIR      (meson test -C build --suite gpu)
# Skips (77) saying why without a python3 whose torch sees a GPU, or without the dataset.
set -euo pipefail
source "$(dirname "$0")/gpu_torch_env.sh"
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -f $data/train-images-idx3-ubyte.gz ]] ||
  { echo "SKIP: needs Fashion-MNIST in $data (Debian: dataset-fashion-mnist)"; exit 77; }
export FASHION_MNIST_DIR=$data
train=$here/torch_train.py
iters=${IT_ITERATIONS:-30}

gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=5s; done
peers=$(gl_peers)
port=$((29500 + RANDOM % 2000))
runs=("momentum gradlane" "adam bytescheduler")
for run in "${runs[@]}"; do
  read -r opt policy <<<"$run"
  port=$((port + 1))
  t0=$SECONDS
  for r in 0 1 2; do
    GLOO_SOCKET_IFNAME=lo "$py" "$train" ddp --device=cuda --rank=$r --world=3 \
      --master=127.0.0.1:$port --optimizer="$opt" --iterations="$iters" \
      --out="$GL_TMP/ddp-$opt.r$r.pt" >"$GL_TMP/ddp-$opt.r$r.out" 2>"$GL_TMP/ddp-$opt.r$r.err" &
    GL_PID[ddp-$opt.r$r]=$!
  done
  for r in 0 1 2; do
    gl_wait "ddp-$opt.r$r" 300 ||
      { gl_show "ddp-$opt.r$r" 30; echo "FAIL: DDP reference ($opt) rank $r" >&2; exit 1; }
  done
  echo "DDP + gloo on the GPU, $opt: $iters iterations ($((SECONDS - t0)) s)"
  t0=$SECONDS
  for r in 0 1 2; do
    gl_bg "$r" "gl-$policy.r$r" "$py" "$train" gradlane --device=cuda --rank=$r --world=3 \
      --job="gpu-torch-$policy" --peers="$peers" --socket="${GL_SOCK[r]}" --policy="$policy" \
      --optimizer="$opt" --iterations="$iters" --out="$GL_TMP/gl-$policy.r$r.pt"
  done
  for r in 0 1 2; do
    gl_wait "gl-$policy.r$r" 300 ||
      { gl_show "gl-$policy.r$r" 30; echo "FAIL: gradlane.torch ($policy) rank $r" >&2; exit 1; }
  done
  if ! "$py" "$train" compare "$GL_TMP/ddp-$opt" "$GL_TMP/gl-$policy" 3; then
    echo "FAIL: gradlane.torch on the GPU, policy $policy ($opt), is not bit-identical to DDP" >&2
    exit 1
  fi
  echo "gradlane.torch on the GPU, policy $policy, $opt: bit-identical to DDP ($((SECONDS - t0)) s)"
done
echo "gpu_torch: ok"
