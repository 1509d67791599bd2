#!/usr/bin/env bash
# tests/bench/device_goodput.sh — what staging GPU tensors costs (docs/gpu.md): one tensor of
# GOODPUT_BYTES reduced by W = 2 daemons on this host, its gradient in host memory (the arena)
# or in GPU 0's memory (gl_register_device_tensor: device → arena before the post, arena →
# device before the completion), alternating host / device / host / device in one run so both
# see the same machine. Prints ms per reduction and goodput (as tests/bench/goodput.sh defines
# it) for each, and device over host.
#
#   tests/bench/device_goodput.sh [BUILD_DIR]      default build dir: build
#   env: GOODPUT_BYTES (268435456), GOODPUT_POLICY (gradlane), GOODPUT_ITERATIONS (5),
#        GOODPUT_WARMUP (2), GOODPUT_MODE (ps | allreduce), GOODPUT_ROUNDS (2: host/device pairs)
# Needs an NVIDIA GPU and its driver; exits 77 saying why where there is none. Hosts are network
# namespaces where they can be made, else loopback (GL_FORCE_LOOPBACK=1 forces it): the link is
# then memory, so the figure isolates what the copies over PCIe add.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-268435456}
policy=${GOODPUT_POLICY:-gradlane}
mode=${GOODPUT_MODE:-ps}
iters=${GOODPUT_ITERATIONS:-5}
warmup=${GOODPUT_WARMUP:-2}
rounds=${GOODPUT_ROUNDS:-2}
source "$root/tests/integration/netns.sh"
source "$root/tests/bench/goodput_lib.sh"
check=$bdir/tests/integration/gradlane-check
goodput_binaries "$bdir" "$check"
# $GRADLANE_CUDA_LIBRARY, if set, picks the driver (the probe line names it): the fake one tests
# this script without a GPU; its figures mean nothing.
if ! probe=$("$check" --probe_device); then
  echo "SKIP: needs an NVIDIA GPU and its driver (libcuda.so.1): $probe"
  exit 77
fi
echo "$probe"

gl_env_init 2
goodput_profile tests/bench/device_goodput.sh
for i in 0 1; do gl_daemon_start "$i" --peer_timeout=10s --max_arena_bytes=$((bytes + (64 << 20))); done
printf "%-7s %-8s %-12s %12s %12s\n" round memory policy "ms/reduce" goodput
declare -A sum=([host]=0 [cuda]=0)
for ((k = 0; k < rounds; k++)); do
  for where in host cuda; do
    replay_extra=(--device="$where")
    out=$(goodput_reduce "$where$k") || { echo "device_goodput: the $where run failed" >&2; exit 1; }
    read -r gp ms <<<"$out"
    printf "%-7s %-8s %-12s %12s %12s\n" "$k" "$where" "$policy" "$ms" "$gp Gb/s"
    sum[$where]=$(awk -v a="${sum[$where]}" -v b="$ms" 'BEGIN { print a + b }')
  done
done
awk -v h="${sum[host]}" -v d="${sum[cuda]}" \
  'BEGIN { printf "device / host time per reduction: %.3f\n", d / h }'
echo "(W=2, $mode, $bytes bytes, $GL_MODE, $iters iterations after $warmup warm-up per row;" \
  "load average $(cut -d' ' -f1-3 /proc/loadavg))"
for i in 0 1; do gl_daemon_stop "$i" || true; done
