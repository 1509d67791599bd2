#!/usr/bin/env bash
# tests/bench/dpdk_goodput.sh — data-path goodput over DPDK (issue #5): one tensor reduced between
# two hosts (network namespaces, veth through a bridge, tbf on every link) through the daemons
# with --transport=dpdk (net_af_packet, qdisc_bypass=0, so tbf applies), versus the raw rate of
# the same vdev measured in the same run by plain DPDK senders/receivers (dpdk_raw: the same
# port code, devargs and datagram size, no protocol), and versus the daemons over TCP.
#
# goodput is per direction (goodput_lib.sh): with W = 2 each link carries S bytes each way per
# reduction, both ways at once. The raw baselines:
#   raw 1-way  — host 0 sends, host 1 receives: the port's rate one way;
#   raw bidir  — one dpdk_raw per host sending and receiving at once, as a daemon does (one
#                polling process per host, like the daemons): the port's rate both ways at
#                once, per direction (the slower one).
# dpdk/port = gradlane-dpdk / raw 1-way; dpdk/bidir = gradlane-dpdk / raw bidir.
#
#   tests/bench/dpdk_goodput.sh [BUILD_DIR]
#   env: GOODPUT_BYTES (536870912), GOODPUT_POLICY (bytescheduler), GOODPUT_ITERATIONS (5),
#        GOODPUT_WARMUP (2),
#        GOODPUT_RATES ("10gbit 25gbit"), RAW_SECONDS (4), GL_MTU (9000),
#        GOODPUT_NICE (-10, as goodput.sh: daemons, clients and dpdk_raw inherit it; "keep": off)
# Needs root (network namespaces) and a DPDK build; exits 77 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-536870912}
policy=${GOODPUT_POLICY:-bytescheduler}
iters=${GOODPUT_ITERATIONS:-5}
warmup=${GOODPUT_WARMUP:-2}
rates=(${GOODPUT_RATES:-10gbit 25gbit})
rsecs=${RAW_SECONDS:-4}
nice=${GOODPUT_NICE:--10}
if [[ $nice != keep ]] && ! renice -n "$nice" -p $$ >/dev/null 2>&1; then
  echo "dpdk_goodput: note: cannot set niceness $nice; running at $(ps -o ni= -p $$ | tr -d ' ')" >&2
fi
source "$root/tests/integration/netns.sh"
source "$root/tests/bench/goodput_lib.sh"
GL_DAEMON=$bdir/daemon/gradlaned
replay=$bdir/tests/bench/gradlane-replay
raw=$bdir/tests/bench/dpdk_raw
for x in "$GL_DAEMON" "$replay" "$raw"; do
  [[ -x $x ]] || { echo "SKIP: $x not built (dpdk_raw needs a DPDK build)" >&2; exit 77; }
done

gl_env_init --need-netns 2
goodput_profile tests/bench/dpdk_goodput.sh

# Raw DPDK rate between host 0 and host 1 (at .101 and .102, where the daemons listen when they
# run); MODE uni (0 sends, 1 receives) or bidir (each host one process doing both). Prints the
# Gbit/s received (bidir: by the slower receiver).
# A receiver counts for RAW_SECONDS - 1 s from half a second after its first datagram, so every
# sender must still be sending then: a one-way sender starts a second after its receiver and
# runs 2 s longer; the two both-ways processes start together.
raw_rate() {
  local mode=$1 n=$RANDOM i role secs
  for i in 1 0; do
    role=both secs=$rsecs
    if [[ $mode == uni ]]; then
      if [[ $i == 0 ]]; then role=send secs=$((rsecs + 2)); sleep 1; else role=recv; fi
    fi
    gl_bg "$i" "raw-$n.$i" "$raw" --mode="$role" --seconds="$secs" --mtu="$GL_MTU" \
      --vdev="net_af_packet$i,iface=eth0,qdisc_bypass=0,blocksz=16384,framesz=16384,framecnt=512" \
      --ip="$GL_SUBNET.$((i + 101))" --peer="$GL_SUBNET.$((2 - i + 100))" \
      --file_prefix="raw$i-$GL_UNIQ" --lcore="$i"
  done
  for i in 0 1; do gl_wait "raw-$n.$i" $((rsecs + 30)) || { gl_show "raw-$n.$i"; return 1; }; done
  cat "$GL_TMP"/raw-$n.*.out | sed -n 's/.*rx_gbps=\([0-9.]*\).*/\1/p' | awk '$1 > 0' | sort -g | head -1
}

# One reduction through the daemons over TRANSPORT (tcp|dpdk); prints "Gbit/s ms".
daemon_goodput() {
  local transport=$1 r
  GL_TRANSPORT=$transport
  for r in 0 1; do gl_daemon_start "$r" --peer_timeout=10s --max_arena_bytes=$((bytes + (64 << 20))); done
  goodput_reduce "$transport-$RANDOM"
  for r in 0 1; do
    gl_daemon_stop "$r" || true
    sed -n "s/.*engine stats: .*\(rounds_reduced=[0-9]* rounds_folded=[0-9]*\).*/  $transport daemon $r: \1/p" \
      "$GL_TMP/daemon$r.err" >&2
  done
  GL_TRANSPORT=tcp
}

printf "%-8s %-13s %9s %13s %12s %12s %12s %10s %11s\n" link policy "ms/reduce" "gradlane-dpdk" \
  "raw 1-way" "raw bidir" "gradlane-tcp" "dpdk/port" "dpdk/bidir"
for rate in "${rates[@]}"; do
  if [[ $rate == unshaped ]]; then gl_shape ""; else gl_shape "$rate"; fi
  bi=$(raw_rate bidir)
  read -r gp ms <<<"$(daemon_goodput dpdk)"
  uni=$(raw_rate uni)
  read -r tcp _ <<<"$(daemon_goodput tcp)"
  printf "%-8s %-13s %9s %13s %12s %12s %12s %10s %11s\n" "$rate" "$policy" "$ms" "$gp Gb/s" \
    "$uni Gb/s" "$bi Gb/s" "$tcp Gb/s" "$(awk -v a="$gp" -v b="$uni" 'BEGIN { printf "%.3f", a / b }')" \
    "$(awk -v a="$gp" -v b="$bi" 'BEGIN { printf "%.3f", a / b }')"
done
echo "(goodput = $bytes bytes per direction per reduction / reduction time, W=2, mtu $GL_MTU, nice $(ps -o ni= -p $$ | tr -d ' '), load $(cut -d' ' -f1 /proc/loadavg);"
echo " raw = dpdk_raw UDP payload rate on the same net_af_packet vdevs: one way, and both ways at once"
echo " with one process per host; dpdk/port = gradlane-dpdk / raw 1-way, dpdk/bidir = / raw bidir)"
