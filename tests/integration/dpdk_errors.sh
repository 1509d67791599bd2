#!/usr/bin/env bash
# dpdk_errors: gradlaned --transport=dpdk refuses bad set-ups with one clear line and exit 1
# (no port, EAL failure, a file prefix another DPDK process holds, no port flag, a non-IPv4
# address, bad fault settings), and a good one (net_null vdev, no NIC needed) prints its ready
# line with the DPDK address and port, then exits 0 on SIGTERM with its protocol counters.
#   dpdk_errors.sh GRADLANED
set -uo pipefail
d=$1
[[ -x $d ]] || { echo "SKIP: gradlaned not built ($d)" >&2; exit 77; }
((EUID == 0)) || { echo "SKIP: the DPDK EAL needs root here (/var/run/dpdk, --no-huge memory)" >&2; exit 77; }
tmp=$(mktemp -d /tmp/gl-dpdk-errors.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
u=$$-$RANDOM
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_error NAME REGEX ARGS... : exits 1 within 30 s with a stderr line matching REGEX.
expect_error() {
  local name=$1 re=$2 rc=0
  shift 2
  timeout 30 "$d" --socket="$tmp/$name.sock" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  ((rc == 1)) || { cat "$tmp/$name.err" >&2; fail "$name: exit $rc (want 1)"; }
  grep -Eq "^gradlaned: error: .*$re" "$tmp/$name.err" || { cat "$tmp/$name.err" >&2; fail "$name: no error line matching '$re'"; }
  echo "$name: $(grep -m1 '^gradlaned: error:' "$tmp/$name.err")"
}

base=(--transport=dpdk --listen=10.251.0.1:0)
expect_error no-port-flag 'needs a port' "${base[@]}"
expect_error no-port 'no DPDK port' "${base[@]}" --dpdk_eal_args="-l0 --no-huge -m 128 --no-pci --file-prefix=gle1-$u"
expect_error eal 'DPDK EAL failed to start' "${base[@]}" --dpdk_eal_args="-l0 --no-huge -m 128 --no-pci --no-such-eal-flag"
expect_error ipv6 'IPv4' --transport=dpdk --listen='[::1]:0' --dpdk_vdev=net_null0 --dpdk_file_prefix="gle2-$u"
expect_error fault 'probability' "${base[@]}" --dpdk_vdev=net_null0 --dpdk_drop_probability=1.5
expect_error window 'dpdk_window' "${base[@]}" --dpdk_vdev=net_null0 --dpdk_window=999
expect_error arp 'MAC' "${base[@]}" --dpdk_vdev=net_null0 --dpdk_static_arp=10.251.0.2=zz:00:00:00:00:00

# A good daemon on a net_null port: ready line with the DPDK address and the default UDP port.
timeout 60 "$d" --socket="$tmp/ok.sock" "${base[@]}" --dpdk_vdev=net_null0 --dpdk_file_prefix="gle3-$u" \
  --dpdk_memory_mb=128 >"$tmp/ok.out" 2>"$tmp/ok.err" &
pid=$!
pids+=("$pid")
for ((i = 0; i < 1200; i++)); do grep -q '^gradlaned ready ' "$tmp/ok.out" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
grep -q "^gradlaned ready socket=$tmp/ok.sock listen=10.251.0.1:7610\$" "$tmp/ok.out" ||
  { cat "$tmp/ok.out" "$tmp/ok.err" >&2; fail "good daemon: no ready line with listen=10.251.0.1:7610"; }
echo "net_null daemon: $(grep -m1 'dpdk port' "$tmp/ok.err" | cut -d' ' -f3-)"
# While it runs, its file prefix is taken.
expect_error busy-prefix 'is in use by another DPDK process' --transport=dpdk --listen=10.251.0.9:0 \
  --dpdk_vdev=net_null1 --dpdk_file_prefix="gle3-$u"
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
((rc == 0)) || fail "good daemon: exit $rc after SIGTERM (want 0)"
grep -q 'dpdk stats: ' "$tmp/ok.err" || fail "good daemon: no dpdk stats line at exit"
echo "PASS dpdk_errors"
