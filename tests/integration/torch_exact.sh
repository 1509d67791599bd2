#!/usr/bin/env bash
# torch_exact: real training through gradlane.torch. Three hosts (network namespaces; loopback
# if none), one gradlaned each (--peer_timeout=3s). A small CNN with BatchNorm trains on
# Fashion-MNIST (Debian's dataset-fashion-mnist) for IT_ITERATIONS (50) iterations, W = 3:
#   - once through DDP over gloo per optimizer (SGD; SGD + Nesterov + weight decay + StepLR;
#     Adam with two param groups; AdamW), with a hook that sums in rank order and divides by W;
#   - through gradlane.torch under every policy, each with one of those optimizers: losses and
#     final parameters must be bit-identical to DDP's, buffers to DDP's rank 0;
#   - the plugin's own rules at W = 1 (torch_errors.py): equal to local training, clear errors
#     for what breaks the scheme;
#   - the kill -9 case: a daemon dies mid-training; every rank must end with a TrainingError
#     (exit 3) within 2 x peer_timeout + 10 s (torch start-up included), none may hang; the
#     same for DDP over the c10d backend (a RuntimeError naming the gradlane backend).
#   - an unchanged DDP script over the c10d backend "gradlane" (import gradlane.c10d;
#     init_process_group("gradlane")): bit-identical to DDP + gloo with a hook doing what the
#     reducer does before a summing backend (x 1/W, then the rank-ordered sum); and each
#     collective's result and refusals (torch_c10d_ops.py);
#   torch_exact.sh GRADLANED LIBGRADLANE PYTHON_PACKAGE_DIR [C10D_MODULE | ""]
# Skips (77) without a python3 that imports torch, or without the dataset.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
daemon=$1 lib=$2 pydir=$3 c10d_module=${4:-}
[[ -x $daemon ]] || { echo "SKIP: gradlaned not built ($daemon)"; exit 77; }
py=""
for cand in ${GL_TORCH_PYTHON:-} /usr/bin/python3 python3; do
  if "$cand" -c 'import torch' 2>/dev/null; then py=$(command -v "$cand"); break; fi
done
[[ -n $py ]] || { echo "SKIP: needs a python3 that imports torch (Debian: python3-torch)"; exit 77; }
data=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
[[ -f $data/train-images-idx3-ubyte.gz ]] ||
  { echo "SKIP: needs Fashion-MNIST in $data (Debian: dataset-fashion-mnist)"; exit 77; }
export PYTHONPATH=$pydir GRADLANE_LIB=$lib FASHION_MNIST_DIR=$data
unset LD_PRELOAD  # an ASan build's runtime does not belong in torch's interpreter
GL_DAEMON=$daemon
iters=${IT_ITERATIONS:-50}
train=$here/torch_train.py
pt=3

gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=${pt}s; done
"$py" -c 'import torch; print("torch", torch.__version__)'

# wait_ranks NAME TIMEOUT_S: every rank's exit code into rc[r]; TIMEOUT_S without a rank's
# progress file changing kills the rest (a hang), so a slow machine is never a failure.
declare -a rc=()
wait_ranks() {
  local name=$1 timeout=$2 r seen="" now deadline running
  deadline=$((SECONDS + timeout))
  while :; do
    running=0
    for r in 0 1 2; do kill -0 "${GL_PID[$name.r$r]}" 2>/dev/null && running=1; done
    ((running)) || break
    now=$(cat "$GL_TMP/$name".r?.progress 2>/dev/null | tr '\n' ' ' || true)
    [[ $now != "$seen" ]] && { seen=$now; deadline=$((SECONDS + timeout)); }
    ((SECONDS >= deadline)) && break
    sleep 0.2
  done
  for r in 0 1 2; do
    rc[r]=0
    gl_wait "$name.r$r" 1 || rc[r]=$?
  done
}

# DDP references: gloo on this host's loopback (the reference needs no namespaces).
optimizers=(sgd momentum adam adamw)
port=$((29500 + RANDOM % 2000))
for opt in "${optimizers[@]}"; do
  port=$((port + 1))
  t0=$SECONDS
  for r in 0 1 2; do
    GLOO_SOCKET_IFNAME=lo "$py" "$train" ddp --rank=$r --world=3 --master=127.0.0.1:$port \
      --optimizer="$opt" --iterations="$iters" --out="$GL_TMP/ddp-$opt.r$r.pt" \
      --progress_file="$GL_TMP/ddp-$opt.r$r.progress" \
      >"$GL_TMP/ddp-$opt.r$r.out" 2>"$GL_TMP/ddp-$opt.r$r.err" &
    GL_PID[ddp-$opt.r$r]=$!
  done
  wait_ranks "ddp-$opt" 120
  for r in 0 1 2; do
    ((rc[r] == 0)) || { gl_show "ddp-$opt.r$r" 20; echo "FAIL: DDP reference ($opt) rank $r: exit ${rc[r]}" >&2; exit 1; }
  done
  echo "DDP + gloo, $opt: $iters iterations ($((SECONDS - t0)) s)"
done

peers=$(gl_peers)
i=0
for policy in fifo p3 bytescheduler prophet gradlane; do
  opt=${optimizers[i % ${#optimizers[@]}]}
  i=$((i + 1))
  t0=$SECONDS
  for r in 0 1 2; do
    gl_bg "$r" "gl-$policy.r$r" "$py" "$train" gradlane --rank=$r --world=3 --job="torch-$policy" \
      --peers="$peers" --socket="${GL_SOCK[r]}" --policy="$policy" --optimizer="$opt" \
      --iterations="$iters" --out="$GL_TMP/gl-$policy.r$r.pt" \
      --progress_file="$GL_TMP/gl-$policy.r$r.progress"
  done
  wait_ranks "gl-$policy" 120
  for r in 0 1 2; do
    if ((rc[r] != 0)); then
      gl_show "gl-$policy.r$r" 20
      echo "FAIL: gradlane.torch, policy $policy, rank $r: exit ${rc[r]}" >&2
      exit 1
    fi
  done
  if ! "$py" "$train" compare "$GL_TMP/ddp-$opt" "$GL_TMP/gl-$policy" 3; then
    echo "FAIL: policy $policy ($opt) is not bit-identical to DDP + gloo" >&2
    exit 1
  fi
  echo "policy $policy, $opt: bit-identical to DDP + gloo ($((SECONDS - t0)) s)"
done

# DDP, unchanged, over the c10d backend: every rank in its namespace (the TCP store on host 0).
if [[ -n $c10d_module ]]; then
  port=$((port + 1))
  for r in 0 1 2; do
    GLOO_SOCKET_IFNAME=lo "$py" "$train" ddp --hook=premul --rank=$r --world=3 \
      --master=127.0.0.1:$port --iterations="$iters" --out="$GL_TMP/ddp-premul.r$r.pt" \
      --progress_file="$GL_TMP/ddp-premul.r$r.progress" \
      >"$GL_TMP/ddp-premul.r$r.out" 2>"$GL_TMP/ddp-premul.r$r.err" &
    GL_PID[ddp-premul.r$r]=$!
  done
  wait_ranks ddp-premul 120
  for r in 0 1 2; do
    ((rc[r] == 0)) || { gl_show "ddp-premul.r$r" 20; echo "FAIL: DDP reference (premul) rank $r: exit ${rc[r]}" >&2; exit 1; }
  done
  port=$((port + 1))
  t0=$SECONDS
  for r in 0 1 2; do
    gl_bg "$r" "c10d.r$r" env GRADLANE_C10D_MODULE="$c10d_module" GRADLANE_SOCKET="${GL_SOCK[r]}" \
      GRADLANE_PEERS="$peers" GRADLANE_POLICY=prophet "$py" "$train" c10d --rank=$r --world=3 \
      --master="${GL_IP[0]}:$port" --iterations="$iters" --out="$GL_TMP/c10d.r$r.pt" \
      --progress_file="$GL_TMP/c10d.r$r.progress"
  done
  wait_ranks c10d 120
  for r in 0 1 2; do
    ((rc[r] == 0)) || { gl_show "c10d.r$r" 20; echo "FAIL: DDP over the gradlane backend, rank $r: exit ${rc[r]}" >&2; exit 1; }
  done
  "$py" "$train" compare "$GL_TMP/ddp-premul" "$GL_TMP/c10d" 3 same ||
    { echo "FAIL: DDP over the gradlane backend is not bit-identical to DDP + gloo" >&2; exit 1; }
  echo "DDP over the c10d backend 'gradlane' (prophet): bit-identical to DDP + gloo ($((SECONDS - t0)) s)"
  port=$((port + 1))
  for r in 0 1 2; do
    gl_bg "$r" "ops.r$r" env GRADLANE_C10D_MODULE="$c10d_module" GRADLANE_SOCKET="${GL_SOCK[r]}" \
      GRADLANE_PEERS="$peers" "$py" "$here/torch_c10d_ops.py" $r 3 "${GL_IP[0]}:$port"
  done
  for r in 0 1 2; do
    rc[r]=0
    gl_wait "ops.r$r" 120 || rc[r]=$?
  done
  cat "$GL_TMP/ops.r0.out"
  for r in 0 1 2; do
    ((rc[r] == 0)) || { gl_show "ops.r$r" 30; echo "FAIL: c10d collective checks, rank $r" >&2; exit 1; }
  done
else
  echo "c10d backend not built (meson -Dtorch; needs libtorch-dev, pybind11-dev, python3-dev): its part is left out"
fi

# The plugin's own rules against daemon 0 alone (W = 1): see torch_errors.py.
gl_bg 0 errors "$py" "$here/torch_errors.py" "${GL_SOCK[0]}"
rc[0]=0
gl_wait errors 120 || rc[0]=$?
cat "$GL_TMP/errors.out"
((rc[0] == 0)) || { gl_show errors 20; echo "FAIL: torch_errors.py: exit ${rc[0]}" >&2; exit 1; }

# kill -9 of daemon 2 mid-training: ranks 0 and 1 hear of it from their daemons (peer
# timeout), rank 2 from its own session ending.
for r in 0 1 2; do
  gl_bg "$r" "doomed.r$r" "$py" "$train" gradlane --rank=$r --world=3 --job=torch-doomed \
    --peers="$peers" --socket="${GL_SOCK[r]}" --policy=bytescheduler --iterations=100000 \
    --out="$GL_TMP/doomed.r$r.pt" --progress_file="$GL_TMP/doomed.r$r.progress"
done
doomed=(doomed)
if [[ -n $c10d_module ]]; then  # the same fault under DDP over the c10d backend
  doomed+=(doomed-c10d)
  port=$((port + 1))
  for r in 0 1 2; do
    gl_bg "$r" "doomed-c10d.r$r" env GRADLANE_C10D_MODULE="$c10d_module" \
      GRADLANE_SOCKET="${GL_SOCK[r]}" GRADLANE_PEERS="$peers" "$py" "$train" c10d --rank=$r \
      --world=3 --master="${GL_IP[0]}:$port" --iterations=100000 \
      --out="$GL_TMP/doomed-c10d.r$r.pt" --progress_file="$GL_TMP/doomed-c10d.r$r.progress"
  done
fi
for name in "${doomed[@]}"; do
  for ((w = 0; w < 1200; w++)); do
    [[ $(cat "$GL_TMP/$name.r0.progress" 2>/dev/null || echo -1) -ge 5 ]] && break
    kill -0 "${GL_PID[$name.r0]}" 2>/dev/null || break
    sleep 0.1
  done
  [[ $(cat "$GL_TMP/$name.r0.progress" 2>/dev/null || echo -1) -ge 5 ]] ||
    { gl_show "$name.r0" 20; echo "FAIL: job $name never reached iteration 5" >&2; exit 1; }
done
gl_daemon_stop 2 KILL || true
t0=$SECONDS
bound=$((2 * pt + 10))
for name in "${doomed[@]}"; do
  want='^TrainingError: '
  [[ $name == doomed-c10d ]] && want='^GradlaneBackendError: '
  for r in 0 1 2; do
    rc[r]=0
    gl_wait "$name.r$r" $((bound - (SECONDS - t0) > 1 ? bound - (SECONDS - t0) : 1)) || rc[r]=$?
  done
  for r in 0 1 2; do
    if ((rc[r] != 3)) || ! grep -q "$want" "$GL_TMP/$name.r$r.err"; then
      gl_show "$name.r$r" 20
      echo "FAIL: $name rank $r after kill -9 of daemon 2: exit ${rc[r]} (want 3 and" \
        "'${want#^}' within ${bound} s)" >&2
      exit 1
    fi
    echo "$name rank $r: $(grep -m1 "$want" "$GL_TMP/$name.r$r.err")"
  done
done
echo "every rank of ${doomed[*]} failed clearly within $((SECONDS - t0)) s of kill -9 of daemon 2"
for i in 0 1; do gl_daemon_alive "$i" || { echo "FAIL: daemon $i died" >&2; exit 1; }; done
echo "PASS torch_exact ($GL_MODE)"
