#!/usr/bin/env bash
# tests/bench/goodput.sh — data-path goodput (docs/design.md §5.2, issue #4): one 1 GiB tensor reduced
# between two hosts (network namespaces joined by veth through a bridge) through the daemons,
# versus iperf3 on the same link in the same run.
#
# goodput (per direction, defined in goodput_lib.sh) is compared with iperf3 --bidir (both
# directions loaded, as the daemons load them; per direction), and, for information, with a
# one-way iperf3 stream.
#
#   tests/bench/goodput.sh [BUILD_DIR]         default build dir: build
#   env: GOODPUT_BYTES (1073741824), GOODPUT_POLICY (bytescheduler), GOODPUT_ITERATIONS (3),
#        GOODPUT_MODE (ps; allreduce: the same tensor by ring all-reduce),
#        GOODPUT_WARMUP (2),
#        GOODPUT_RATES ("unshaped 5gbit": one measurement per entry), GOODPUT_IPERF_SECONDS (4),
#        GOODPUT_NICE (-10: the daemons, clients and iperf3 alike inherit it, so a build running
#        beside the benchmark takes less from both sides; "keep" leaves it)
# Needs root (network namespaces) and iperf3; exits 77 if either is missing.
set -euo pipefail
nice=${GOODPUT_NICE:--10}
if [[ $nice != keep ]] && ! renice -n "$nice" -p $$ >/dev/null 2>&1; then
  echo "goodput: note: cannot set niceness $nice; running at $(ps -o ni= -p $$ | tr -d ' ')" >&2
fi
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-1073741824}
policy=${GOODPUT_POLICY:-bytescheduler}
mode=${GOODPUT_MODE:-ps}
iters=${GOODPUT_ITERATIONS:-3}
warmup=${GOODPUT_WARMUP:-2}
rates=(${GOODPUT_RATES:-unshaped 5gbit})
isecs=${GOODPUT_IPERF_SECONDS:-4}
source "$root/tests/integration/netns.sh"
source "$root/tests/bench/goodput_lib.sh"
goodput_binaries "$bdir"
command -v iperf3 >/dev/null || { echo "SKIP: iperf3 not installed" >&2; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: python3 needed to read iperf3's JSON" >&2; exit 77; }

gl_env_init --need-netns 2
goodput_profile tests/bench/goodput.sh

# iperf3 between host 0 (client) and host 1 (server); prints Gbit/s per direction.
iperf() {  # iperf MODE(uni|bidir)
  local mode=$1 extra=() n=$((RANDOM))
  [[ $mode == bidir ]] && extra=(--bidir)
  gl_bg 1 "iperf-s-$n" iperf3 -s -1 -B "${GL_IP[1]}" -p 5201 --forceflush
  gl_wait_line "$GL_TMP/iperf-s-$n.out" 'listening' 10 "${GL_PID[iperf-s-$n]}" ||
    { gl_show "iperf-s-$n"; echo "iperf3 server did not start" >&2; return 1; }
  gl_bg 0 "iperf-c-$n" iperf3 -c "${GL_IP[1]}" -p 5201 -t "$isecs" -J "${extra[@]}"
  gl_wait "iperf-c-$n" $((isecs + 20)) || { gl_show "iperf-c-$n"; return 1; }
  gl_wait "iperf-s-$n" 10 || true
  python3 - "$GL_TMP/iperf-c-$n.out" "$mode" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["end"]
a = d["sum_received"]["bits_per_second"]
if sys.argv[2] == "bidir":
    b = d["sum_received_bidir_reverse"]["bits_per_second"]
    print("%.3f" % (min(a, b) / 1e9))
else:
    print("%.3f" % (a / 1e9))
PY
}

for i in 0 1; do gl_daemon_start "$i" --peer_timeout=10s --max_arena_bytes=$((bytes + (64 << 20))); done
printf "%-10s %-14s %10s %12s %12s %12s %8s %8s\n" link policy "ms/reduce" "gradlane" \
  "iperf3 bidir" "iperf3 1-way" ratio "ratio-1way"
for rate in "${rates[@]}"; do
  if [[ $rate == unshaped ]]; then gl_shape ""; else gl_shape "$rate"; fi
  bi=$(iperf bidir)
  read -r gp ms <<<"$(goodput_reduce "$rate")"
  uni=$(iperf uni)
  printf "%-10s %-14s %10s %12s %12s %12s %8s %8s\n" "$rate" "$policy" "$ms" "$gp Gb/s" \
    "$bi Gb/s" "$uni Gb/s" "$(awk -v a="$gp" -v b="$bi" 'BEGIN { printf "%.3f", a / b }')" \
    "$(awk -v a="$gp" -v b="$uni" 'BEGIN { printf "%.3f", a / b }')"
done
echo "(goodput = $bytes bytes per direction per reduction / reduction time, W=2, $GL_MODE, mtu $GL_MTU, nice $(ps -o ni= -p $$ | tr -d ' ');"
echo " ratio = gradlane / iperf3 --bidir per direction, the same load pattern on the same veth)"
for i in 0 1; do gl_daemon_stop "$i" || true; done
