#!/usr/bin/env bash
# tests/bench/verbs_goodput.sh — goodput of the verbs transport against perftest's ib_write_bw on
# the same RDMA device: one tensor reduced by two daemons (--transport=verbs) on this host, then
# ib_write_bw in both directions at once (the daemons load both directions too). On soft-RoCE in
# tests/rxe's guest this is a functional check, not a speed one (TCG); docs/verbs.md gives the
# two-host procedure for a real RDMA NIC.
#
#   tests/rxe/rxe-guest.sh -- tests/bench/verbs_goodput.sh [BUILD_DIR]
#   env: GOODPUT_BYTES (67108864), GOODPUT_ITERATIONS (3), GOODPUT_POLICY (gradlane),
#        VERBS_DEVICE (rxe0), VERBS_GID_INDEX (1)
# Exits 77 without ib_write_bw or an RDMA device.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$root/build}
bytes=${GOODPUT_BYTES:-67108864}
policy=${GOODPUT_POLICY:-gradlane}
mode=ps
iters=${GOODPUT_ITERATIONS:-3}
warmup=1
dev=${VERBS_DEVICE:-rxe0}
gid=${VERBS_GID_INDEX:-1}
export GL_FORCE_LOOPBACK=1 GL_TRANSPORT=verbs
export GL_VERBS_FLAGS="--verbs_device=$dev --verbs_gid_index=$gid"
source "$root/tests/integration/netns.sh"
source "$root/tests/bench/goodput_lib.sh"
goodput_binaries "$bdir"
command -v ib_write_bw >/dev/null || { echo "SKIP: ib_write_bw (perftest) not installed" >&2; exit 77; }
ibv_devices 2>/dev/null | grep -q "$dev" || { echo "SKIP: no RDMA device $dev" >&2; exit 77; }

gl_env_init 2
goodput_profile tests/bench/verbs_goodput.sh
for i in 0 1; do gl_daemon_start "$i" --max_arena_bytes=$((bytes + (64 << 20))); done
read -r gp ms <<<"$(goodput_reduce verbs)"
for i in 0 1; do gl_daemon_stop "$i" || true; done

# perftest, both directions at once, 1 MiB messages; its figure is the sum of both directions.
ib_write_bw -d "$dev" -x "$gid" -s 1048576 -n 200 -b --report_gbits >"$GL_TMP/ibw-s.out" 2>&1 &
server=$!
sleep 1
ib_write_bw -d "$dev" -x "$gid" -s 1048576 -n 200 -b --report_gbits 127.0.0.1 >"$GL_TMP/ibw-c.out" 2>&1
wait "$server" || true
both=$(awk '$1 == 1048576 { print $4 }' "$GL_TMP/ibw-c.out" | tail -1)
[[ -n $both ]] || { cat "$GL_TMP/ibw-c.out" >&2; echo "ib_write_bw printed no result" >&2; exit 1; }
per=$(awk -v b="$both" 'BEGIN { printf "%.3f", b / 2 }')
printf "%-8s %-10s %10s %14s %22s %8s\n" device policy "ms/reduce" "gradlane" "ib_write_bw -b, 1 dir" ratio
printf "%-8s %-10s %10s %14s %22s %8s\n" "$dev" "$policy" "$ms" "$gp Gb/s" "$per Gb/s" \
  "$(awk -v a="$gp" -v b="$per" 'BEGIN { printf "%.3f", a / b }')"
echo "(goodput = $bytes bytes per direction per reduction / reduction time, W=2, one host, load $(cut -d' ' -f1-3 /proc/loadavg))"
