#!/usr/bin/env bash
# tests/bench/dpdk_goodput.sh — data-path goodput over DPDK (issue #5): one tensor reduced between
# two hosts (network namespaces, veth through a bridge, tbf on every link) through the daemons
# with --transport=dpdk (net_af_packet, qdisc_bypass=0, so tbf applies), versus the raw rate of
# the same vdev measured in the same run by a plain DPDK sender/receiver pair (dpdk_raw: the same
# port code and frame size, no protocol), and versus the daemons over TCP.
#
# goodput = S / (one reduction, client post to completion), per direction, as in goodput.sh:
# with W = 2 each link carries S bytes each way at once. The raw baseline is the port's rate one
# way (what the link gives a plain DPDK sender) and, for information, both ways at once (a
# sender and a receiver process on each host: four polling processes, so on a small host that
# figure is bounded by CPU rather than by the link).
#
#   tests/bench/dpdk_goodput.sh [BUILD_DIR]
#   env: GOODPUT_BYTES (536870912), GOODPUT_POLICY (bytescheduler), GOODPUT_ITERATIONS (3),
#        GOODPUT_RATES ("10gbit 25gbit"), RAW_SECONDS (4), GL_MTU (9000),
#        GOODPUT_NICE (-10, as goodput.sh: daemons, clients and dpdk_raw inherit it; "keep": off)
# Needs root (network namespaces) and a DPDK build; exits 77 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-536870912}
policy=${GOODPUT_POLICY:-bytescheduler}
iters=${GOODPUT_ITERATIONS:-3}
rates=(${GOODPUT_RATES:-10gbit 25gbit})
rsecs=${RAW_SECONDS:-4}
nice=${GOODPUT_NICE:--10}
if [[ $nice != keep ]] && ! renice -n "$nice" -p $$ >/dev/null 2>&1; then
  echo "dpdk_goodput: note: cannot set niceness $nice; running at $(ps -o ni= -p $$ | tr -d ' ')" >&2
fi
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

# Raw DPDK rate of host 0 <-> host 1; MODE uni (0 sends, 1 receives) or bidir (both at once).
# Sender and receiver are separate processes on each host (each its own EAL and af_packet
# socket): one thread doing both would sit blocked in the PMD's full TX ring while its RX ring
# overflows, and measure that instead of the port. Receivers use .101/.102, senders .111/.112.
# Prints Gbit/s received (bidir: the slower direction).
raw_rate() {
  local mode=$1 n=$RANDOM i
  for i in 0 1; do
    [[ $mode == uni && $i == 0 ]] && continue
    gl_bg "$i" "rawr-$n.$i" "$raw" --mode=recv --seconds="$rsecs" --mtu="$GL_MTU" \
      --vdev="net_af_packet$i,iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512" \
      --ip="$GL_SUBNET.$((i + 101))" --file_prefix="rawr$i-$GL_UNIQ" --lcore="$i"
  done
  sleep 1  # receivers up (and answering ARP) before the senders start their window
  for i in 0 1; do
    [[ $mode == uni && $i == 1 ]] && continue
    gl_bg "$i" "raws-$n.$i" "$raw" --mode=send --seconds="$((rsecs + 2))" --mtu="$GL_MTU" \
      --vdev="net_af_packet$((i + 2)),iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512" \
      --ip="$GL_SUBNET.$((i + 111))" --peer="$GL_SUBNET.$((2 - i + 100))" \
      --file_prefix="raws$i-$GL_UNIQ" --lcore="$i"
  done
  for i in 0 1; do
    for r in rawr raws; do
      [[ -n ${GL_PID[$r-$n.$i]:-} ]] || continue
      gl_wait "$r-$n.$i" $((rsecs + 30)) || { gl_show "$r-$n.$i"; return 1; }
    done
  done
  cat "$GL_TMP"/rawr-$n.*.out | sed -n 's/.*rx_gbps=\([0-9.]*\).*/\1/p' | sort -g | head -1
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

printf "%-8s %-13s %9s %12s %12s %12s %12s %10s %11s\n" link policy "ms/reduce" "gradlane-dpdk" \
  "raw 1-way" "raw bidir" "gradlane-tcp" "dpdk/port" "dpdk/bidir"
for rate in "${rates[@]}"; do
  if [[ $rate == unshaped ]]; then gl_shape ""; else gl_shape "$rate"; fi
  bi=$(raw_rate bidir)
  read -r gp ms <<<"$(daemon_goodput dpdk)"
  uni=$(raw_rate uni)
  read -r tcp _ <<<"$(daemon_goodput tcp)"
  printf "%-8s %-13s %9s %12s %12s %12s %12s %10s %11s\n" "$rate" "$policy" "$ms" "$gp Gb/s" \
    "$uni Gb/s" "$bi Gb/s" "$tcp Gb/s" "$(awk -v a="$gp" -v b="$uni" 'BEGIN { printf "%.3f", a / b }')" \
    "$(awk -v a="$gp" -v b="$bi" 'BEGIN { printf "%.3f", a / b }')"
done
echo "(goodput = $bytes bytes per direction per reduction / reduction time, W=2, mtu $GL_MTU, nice $(ps -o ni= -p $$ | tr -d ' '), load $(cut -d' ' -f1 /proc/loadavg);"
echo " raw = dpdk_raw UDP payload rate on the same net_af_packet vdevs, one way (the port rate) and"
echo " both ways at once (four polling processes on this host's cores); dpdk/port = gradlane-dpdk / raw 1-way)"
