#!/usr/bin/env bash
# torch_bench.sh — real training, DDP + gloo against gradlane.torch (docs/training.md §3).
# Three hosts in network namespaces, every link shaped with tbf at each RATE; per rate: DDP
# with its stock all-reduce (gloo over the shaped links), then gradlane.torch under each
# policy (one gradlaned per host, TCP). First the three ranks without communication: the
# compute floor on this machine, against which DDP's communication share is read. ResNet-18 at 32x32, synthetic data. Prints one CSV
# row per run: median and p90 iteration time and median forward+backward time over every
# rank's measured iterations, the daemons' CPU (% of one core, summed over the three), rank 0's
# most-stalled layers (ms per iteration), the load average.
#   tests/bench/torch_bench.sh BUILD_DIR [CSV]
#   env: RATES ("1gbit 3gbit 10gbit"), POLICIES ("fifo bytescheduler prophet gradlane"),
#        ITERS (30), WARMUP (5), BATCH (16), C10D_MODULE (the built gradlane/_c10d: adds
#        unchanged DDP over the c10d backend "gradlane")
# Root (namespaces) and Debian's python3-torch are required. Not a test: about 2 min a rate.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
csv=${2:-/dev/null}
source "$root/tests/integration/netns.sh"
GL_DAEMON=$build/daemon/gradlaned
py=/usr/bin/python3
$py -c 'import torch' || { echo "needs python3-torch" >&2; exit 1; }
export PYTHONPATH=$root/libclient/python GRADLANE_LIB=$build/libclient/libgradlane.so.1
bench=$root/tests/bench/torch_bench.py
iters=${ITERS:-30} warmup=${WARMUP:-5} batch=${BATCH:-16}
echo "rate,mode,policy,median_ms,p90_ms,fwd_bwd_ms,daemon_cpu_pct,load1,stalled_layers" >"$csv"

cpu_ticks() {  # summed utime+stime of the running daemons
  local t=0 pid f
  for pid in "${GL_DPID[@]}"; do
    f=$(cut -d' ' -f14,15 "/proc/$pid/stat" 2>/dev/null) || continue
    t=$((t + ${f% *} + ${f#* }))
  done
  echo "$t"
}

report() {  # rate mode policy json-of-rank-0 cpu_pct: pools every rank's iterations
  $py - "$@" <<'PY'
import json, os, statistics, sys
rate, mode, policy, path, cpu = sys.argv[1:6]
# Every rank's iterations: in the "local" runs the ranks do not wait for each other, so one
# rank's figures depend on when the others ran; in the distributed runs they are in step.
ranks = [json.load(open(path.replace(".r0.", f".r{i}."))) for i in range(3)]
r = ranks[0]
t = sorted(x for q in ranks for x in q["iteration_s"])
med = statistics.median(t) * 1e3
p90 = t[min(len(t) - 1, int(round(0.9 * (len(t) - 1))))] * 1e3
fb = statistics.median([x for q in ranks for x in q["forward_backward_s"]]) * 1e3
stalls = sorted(r["forward_stall_s"].items(), key=lambda kv: -kv[1])[:3]
n = len(r["iteration_s"])
stall = " ".join(f"{k}:{v / n * 1e3:.1f}ms" for k, v in stalls)
load = os.getloadavg()[0]
print(f"{rate:>7} {mode:8} {policy:13} median {med:7.1f} ms  p90 {p90:7.1f} ms  "
      f"fwd+bwd {fb:6.1f} ms  daemons {cpu:>5}% CPU  load {load:.1f}  {stall}")
with open(os.environ["CSV"], "a") as f:
    f.write(f"{rate},{mode},{policy},{med:.1f},{p90:.1f},{fb:.1f},{cpu},{load:.2f},{stall}\n")
PY
}
export CSV=$csv

# run_on_daemons NAME MODE POLICY CMD... : CMD on every host with --rank and --out added and
# its daemon's socket in GRADLANE_SOCKET; then the report row
# with the daemons' CPU over the run.
run_on_daemons() {
  local name=$1 mode=$2 policy=$3 r t0 t1 s0 s1 cpu
  shift 3
  t0=$(cpu_ticks) s0=$(date +%s.%N)
  for r in 0 1 2; do
    gl_bg "$r" "$name.r$r" env GRADLANE_SOCKET="${GL_SOCK[r]}" "$@" --rank=$r \
      --out="$GL_TMP/$name.r$r.json"
  done
  for r in 0 1 2; do gl_wait "$name.r$r" 900 || { gl_show "$name.r$r" 20; exit 1; }; done
  t1=$(cpu_ticks) s1=$(date +%s.%N)
  cpu=$(awk -v a="$t0" -v b="$t1" -v s="$s0" -v e="$s1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN{printf "%.0f", (b - a) / hz / (e - s) * 100}')
  report "$rate" "$mode" "$policy" "$GL_TMP/$name.r0.json" "$cpu"
}

bench_rate() {  # rate: one namespace set, DDP then each policy
  local rate=$1 r policy peers port
  gl_env_init --need-netns 3 "$rate"
  for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=10s; done
  local common=(--world=3 --iterations="$iters" --warmup="$warmup" --batch="$batch")
  # The compute floor: the same three ranks training alone, sharing the machine's cores.
  for r in 0 1 2; do
    gl_bg "$r" "local.r$r" $py "$bench" local "${common[@]}" --rank=$r --out="$GL_TMP/local.r$r.json"
  done
  for r in 0 1 2; do gl_wait "local.r$r" 900 || { gl_show "local.r$r" 20; exit 1; }; done
  report "$rate" local "" "$GL_TMP/local.r0.json" "-"
  port=$((29500 + RANDOM % 2000))
  for r in 0 1 2; do
    gl_bg "$r" "ddp.r$r" env GLOO_SOCKET_IFNAME=eth0 $py "$bench" ddp "${common[@]}" \
      --rank=$r --master="${GL_IP[0]}:$port" --out="$GL_TMP/ddp.r$r.json"
  done
  for r in 0 1 2; do gl_wait "ddp.r$r" 900 || { gl_show "ddp.r$r" 20; exit 1; }; done
  report "$rate" ddp "" "$GL_TMP/ddp.r0.json" "-"
  peers=$(gl_peers)
  if [[ -n ${C10D_MODULE:-} ]]; then  # unchanged DDP over the c10d backend, default policy
    port=$((port + 1))
    run_on_daemons c10d c10d "" env GRADLANE_C10D_MODULE="$C10D_MODULE" GRADLANE_PEERS="$peers" \
      $py "$bench" c10d "${common[@]}" --master="${GL_IP[0]}:$port"
  fi
  for policy in ${POLICIES:-fifo bytescheduler prophet gradlane}; do
    run_on_daemons "gl-$policy" gradlane "$policy" $py "$bench" gradlane "${common[@]}" \
      --job="bench-$policy" --peers="$peers" --policy="$policy"
  done
}

# Each rate in a subshell: its EXIT trap removes that rate's namespaces and processes.
for rate in ${RATES:-1gbit 3gbit 10gbit}; do
  (bench_rate "$rate")
done
