#!/usr/bin/env bash
# tests/bench/dpdk_goodput.sh — data-path goodput over DPDK (issue #5): one tensor reduced between
# two hosts (network namespaces, veth through a bridge, tbf on every link) through the daemons
# with --transport=dpdk (net_af_packet, qdisc_bypass=0, so tbf applies), versus the raw rate of
# the same vdev measured in the same run by a plain DPDK sender/receiver pair (dpdk_raw: the same
# port code and frame size, no protocol), and versus the daemons over TCP.
#
# goodput = S / (one reduction, client post to completion), per direction, as in goodput.sh:
# with W = 2 each link carries S bytes each way at once. The raw baseline is measured both ways
# at once too (dpdk_raw --mode=both on each host, the same load pattern; per direction, the
# slower of the two) and, for information, one way.
#
#   tests/bench/dpdk_goodput.sh [BUILD_DIR]
#   env: GOODPUT_BYTES (536870912), GOODPUT_POLICY (bytescheduler), GOODPUT_ITERATIONS (3),
#        GOODPUT_RATES ("10gbit 25gbit"), RAW_SECONDS (4), GL_MTU (9000)
# Needs root (network namespaces) and a DPDK build; exits 77 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-536870912}
policy=${GOODPUT_POLICY:-bytescheduler}
iters=${GOODPUT_ITERATIONS:-3}
rates=(${GOODPUT_RATES:-10gbit 25gbit})
rsecs=${RAW_SECONDS:-4}
source "$root/tests/integration/netns.sh"
GL_DAEMON=$bdir/daemon/gradlaned
replay=$bdir/tests/bench/gradlane-replay
raw=$bdir/tests/bench/dpdk_raw
for x in "$GL_DAEMON" "$replay" "$raw"; do
  [[ -x $x ]] || { echo "SKIP: $x not built (dpdk_raw needs a DPDK build)" >&2; exit 77; }
done

gl_env_init --need-netns 2
cat >"$GL_TMP/one-tensor.json" <<JSON
{ "model": "goodput-$bytes", "reference": "one tensor, zero compute: tests/bench/dpdk_goodput.sh",
  "layers": [ {"name": "g", "param_bytes": $bytes, "fwd_us": 0, "bwd_us": 0} ] }
JSON

# Raw DPDK rate of host 0 <-> host 1; MODE uni (0 sends, 1 receives) or bidir. Prints Gbit/s.
raw_rate() {
  local mode=$1 n=$RANDOM i m
  for i in 0 1; do
    m=both
    [[ $mode == uni ]] && { ((i == 0)) && m=send || m=recv; }
    gl_bg "$i" "raw-$n.$i" "$raw" --mode="$m" --seconds="$rsecs" --mtu="$GL_MTU" \
      --vdev="net_af_packet$i,iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512" \
      --ip="$GL_SUBNET.$((i + 101))" --peer="$GL_SUBNET.$((2 - i + 100))" \
      --file_prefix="raw$i-$GL_UNIQ" --lcore="$i"
  done
  for i in 0 1; do gl_wait "raw-$n.$i" $((rsecs + 30)) || { gl_show "raw-$n.$i"; return 1; }; done
  if [[ $mode == uni ]]; then
    sed -n 's/.*rx_gbps=\([0-9.]*\).*/\1/p' "$GL_TMP/raw-$n.1.out"
  else
    cat "$GL_TMP/raw-$n.0.out" "$GL_TMP/raw-$n.1.out" | sed -n 's/.*rx_gbps=\([0-9.]*\).*/\1/p' | sort -g | head -1
  fi
}

# One reduction through the daemons over TRANSPORT (tcp|dpdk); prints "Gbit/s ms".
daemon_goodput() {
  local transport=$1 tag=$1-$RANDOM r peers
  GL_TRANSPORT=$transport
  for r in 0 1; do gl_daemon_start "$r" --peer_timeout=10s --max_arena_bytes=$((bytes + (64 << 20))); done
  peers=$(gl_peers)
  for r in 0 1; do
    gl_bg "$r" "replay-$tag.r$r" "$replay" --profile="$GL_TMP/one-tensor.json" \
      --socket="${GL_SOCK[r]}" --job="goodput-$tag" --rank="$r" --world=2 --peers="$peers" \
      --policy="$policy" --token=goodput --iterations="$iters" --warmup=1 --timeout_ms=60000 \
      --csv="$GL_TMP/$tag.r$r.csv" --quiet
  done
  for r in 0 1; do gl_wait "replay-$tag.r$r" 300 || { gl_show "replay-$tag.r$r"; return 1; }; done
  for r in 0 1; do gl_daemon_stop "$r" || true; done
  GL_TRANSPORT=tcp
  cat "$GL_TMP/$tag.r0.csv" "$GL_TMP/$tag.r1.csv" |
    awk -F, -v b="$bytes" '$1 != "iteration" && $4 == 0 { s += $2; n++ }
      END { ms = s / n; printf "%.3f %.1f\n", b * 8 / (ms / 1e3) / 1e9, ms }'
}

printf "%-8s %-13s %9s %12s %12s %12s %12s %8s %8s\n" link policy "ms/reduce" "gradlane-dpdk" \
  "raw bidir" "raw 1-way" "gradlane-tcp" ratio "ratio-1way"
for rate in "${rates[@]}"; do
  if [[ $rate == unshaped ]]; then gl_shape ""; else gl_shape "$rate"; fi
  bi=$(raw_rate bidir)
  read -r gp ms <<<"$(daemon_goodput dpdk)"
  uni=$(raw_rate uni)
  read -r tcp _ <<<"$(daemon_goodput tcp)"
  printf "%-8s %-13s %9s %12s %12s %12s %12s %8s %8s\n" "$rate" "$policy" "$ms" "$gp Gb/s" \
    "$bi Gb/s" "$uni Gb/s" "$tcp Gb/s" "$(awk -v a="$gp" -v b="$bi" 'BEGIN { printf "%.3f", a / b }')" \
    "$(awk -v a="$gp" -v b="$uni" 'BEGIN { printf "%.3f", a / b }')"
done
echo "(goodput = $bytes bytes per direction per reduction / reduction time, W=2, mtu $GL_MTU;"
echo " raw = dpdk_raw UDP payload rate on the same net_af_packet vdevs; ratio = gradlane-dpdk / raw bidir)"
