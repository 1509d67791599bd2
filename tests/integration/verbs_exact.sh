#!/usr/bin/env bash
# verbs_exact: parameter-server jobs over the RDMA verbs transport (--transport=verbs), run inside
# tests/rxe's QEMU guest where soft-RoCE (rxe0 on lo) is the device and every daemon listens on
# 127.0.0.1. Three daemons: gradlane and fifo jobs, every result bit-exact (small segments go
# eagerly with their header, the rest by RDMA WRITE with immediate); then two daemons. Then the
# flush case: kill -9 of one daemon mid-job; the other ranks must get error completions (their
# queue pairs flush, the TCP connections reset) within the bound, the survivors stay up, and a
# job on a restarted daemon is bit-exact. The stopped case: SIGSTOP of one daemon mid-job; the
# others must fail it within the bound (no reply, no completion for --peer_timeout). While the W=3
# gradlane job runs, daemon 0's `gradlanectl peers` must show each peer's RDMA bytes both ways
# (the segments never touch the TCP connections). After the W=3 jobs, daemon 0's `gradlanectl status`
# and its /metrics must show the verbs backend on rxe0 and nonzero eager and rendezvous counters
# both ways, no RNR and no refused registration (and the port's hw_counters where sysfs has them).
# With the fake CUDA driver, a W=3 job of device tensors (GPUDirect): the daemons accept the
# clients' dma-bufs, and the kernel's answer to ibv_reg_dmabuf_mr decides the rest — soft-RoCE has
# no dma-buf memory regions, so each tensor must be counted staged, logged with the reason, and
# still bit-exact (a kernel that registers them would count them registered instead).
#   verbs_exact.sh GRADLANED GRADLANE-CHECK [GRADLANECTL [FAKE-CUDA-LIBRARY]]
#                                               (inside the guest: tests/rxe/rxe-guest.sh -- ...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$1" "$2"
CTL=${3:-}
FAKE_CUDA=${4:-}
if ! ibv_devices 2>/dev/null | grep -q rxe; then
  echo "SKIP: no RDMA device (run it through tests/rxe/rxe-guest.sh)"
  exit 77
fi
export GL_FORCE_LOOPBACK=1 GL_TRANSPORT=verbs
# Tensors of every dtype, from one element to 1.2 MB: both sides of the 8 KiB eager limit.
sizes=(--sizes=1,3,1023,2049,50001,300001)
pt=2
bound=$((2 * pt + 3))

gl_env_init 3
gl_daemon_start 0 --peer_timeout=${pt}s --metrics_address=127.0.0.1:0
for i in 1 2; do gl_daemon_start "$i" --peer_timeout=${pt}s; done
line=$(grep -m1 'gradlaned: ops metrics=' "$GL_TMP/daemon0.err")
[[ $line =~ metrics=([^ ]+)\ admin=([^ ]+) ]] || it_fail "no metrics/admin address in '$line'"
metrics=${BASH_REMATCH[1]} admin=${BASH_REMATCH[2]}

# Daemon 0's `gradlanectl peers` while job $1 runs (its clients linger after their last
# iteration, so the job stays up until this has looked): both peers up, each with at least
# 100 kB of RDMA data sent and received (5.4 MiB each way after the job's three iterations; the
# TCP connections carry only the hellos and set-up frames, a few hundred bytes).
verbs_peers_check() {
  local job=$1 r running deadline=$((SECONDS + 200))
  while :; do
    ((SECONDS < deadline)) || it_fail "gradlanectl peers did not show job $job's RDMA bytes in 200 s: $(cat "$GL_TMP/ctl-peers.json")"
    "$CTL" --socket="$admin" --json peers >"$GL_TMP/ctl-peers.json" 2>/dev/null || true
    python3 - "$GL_TMP/ctl-peers.json" "$job" <<'PY' && break
import json, sys
try:
    peers = [p for p in json.load(open(sys.argv[1]))["peers"] if p["job"] == sys.argv[2]]
except (ValueError, KeyError):
    sys.exit(1)
ok = len(peers) == 2 and all(p["state"] == "up" and p["bytes_sent"] >= 100000 and
                             p["bytes_received"] >= 100000 for p in peers)
sys.exit(0 if ok else 1)
PY
    running=0
    for r in 0 1 2; do kill -0 "${GL_PID[$job.r$r]}" 2>/dev/null && running=1; done
    ((running)) || it_fail "job $job ended before gradlanectl peers showed its RDMA bytes: $(cat "$GL_TMP/ctl-peers.json")"
    sleep 0.2
  done
  "$CTL" --socket="$admin" peers | grep -E "^$job " || true
  echo "gradlanectl peers: both peers of $job up, >= 100 kB of RDMA data each way"
}

seed=300
for policy in gradlane fifo; do
  seed=$((seed + 1))
  t0=$SECONDS
  linger=()
  [[ $policy == gradlane && -x $CTL ]] && linger=(--linger_ms=10000)
  it_job_start "v3-$policy" "$policy" 3 "$seed" -- --quiet "${sizes[@]}" "${linger[@]}"
  ((${#linger[@]})) && verbs_peers_check "v3-$policy"
  it_job_wait "v3-$policy" 200 || it_fail "W=3 $policy over verbs: a rank failed (above)"
  echo "W=3 $policy: 3 ranks x 3 iterations bit-exact over verbs ($((SECONDS - t0)) s)"
done

# What daemon 0 says about its backend after those jobs: gradlanectl and the metrics endpoint.
hw=/sys/class/infiniband/rxe0/ports/1/hw_counters
if [[ -x $CTL ]]; then
  "$CTL" --socket="$admin" status | tee "$GL_TMP/ctl-status.txt" | grep -E '^(backend|rdma|registrations|transport) '
  grep -q '^backend  *verbs: device rxe0, port 1, GID index 1$' "$GL_TMP/ctl-status.txt" ||
    it_fail "gradlanectl status does not name the verbs backend on rxe0 (above)"
  "$CTL" --socket="$admin" --json status >"$GL_TMP/ctl-status.json"
  python3 - "$GL_TMP/ctl-status.json" "$hw" <<'PY' || it_fail "gradlanectl's counters of the verbs backend (above)"
import json, os, sys
r = json.load(open(sys.argv[1]))
c = {row["name"]: row["value"] for row in r["backend_counters"]}
bad = []
if r["backend"] != "verbs" or r["backend_info"].get("device") != "rxe0":
    bad.append(f"backend {r['backend']} {r['backend_info']}")
for k in ["eager_sends", "eager_bytes", "rendezvous_headers", "clear_to_send", "rendezvous_writes",
          "rendezvous_bytes", "segments_acked", "eager_received", "rendezvous_received",
          "receives_posted", "replies_written", "credit_writes", "completions"]:
    if c.get("verbs_" + k, 0) <= 0:
        bad.append(f"verbs_{k} = {c.get('verbs_' + k)}")
for k in ["rnr_errors", "registration_failures"]:
    if c.get("verbs_" + k) != 0:
        bad.append(f"verbs_{k} = {c.get('verbs_' + k)}")
if r["transport_bytes_sent"] < c["verbs_eager_bytes"] + c["verbs_rendezvous_bytes"]:
    bad.append("transport_bytes_sent leaves out the RDMA data path")
if os.path.isdir(sys.argv[2]) and c.get("verbs_hw_sent_pkts", 0) <= 0:
    bad.append(f"{sys.argv[2]} exists but verbs_hw_sent_pkts = {c.get('verbs_hw_sent_pkts')}")
print("  " + ", ".join(f"{k}={v}" for k, v in c.items() if k.startswith("verbs_hw_") or v))
for b in bad: print("  wrong:", b)
sys.exit(1 if bad else 0)
PY
else
  echo "(gradlanectl not given: its check skipped)"
fi
python3 - "$metrics" <<'PY' || it_fail "the metrics endpoint's verbs families (above)"
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
def value(pattern):
    m = re.search("^" + pattern + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None
want = {
    r'gradlane_transport_info\{backend="verbs",device="rxe0",port="1",gid_index="1"\}': lambda v: v == 1,
    r"gradlane_verbs_eager_sends_total": lambda v: v > 0,
    r'gradlane_verbs_rendezvous_total\{step="write"\}': lambda v: v > 0,
    r"gradlane_verbs_rendezvous_received_total": lambda v: v > 0,
    r'gradlane_verbs_error_completions_total\{status="receiver_not_ready"\}': lambda v: v == 0,
    r"gradlane_verbs_registrations": lambda v: v >= 0,
}
bad = [p for p, ok in want.items() if value(p) is None or not ok(value(p))]
for line in text.splitlines():
    if line.startswith(("gradlane_transport_info", "gradlane_verbs_rendezvous_total", "gradlane_verbs_hw_counters_total{device=\"rxe0\",port=\"1\",counter=\"sent_pkts\"}")):
        print("  " + line)
for p in bad: print("  missing or wrong:", p, value(p))
sys.exit(1 if bad else 0)
PY
echo "daemon 0: gradlanectl and /metrics show the verbs backend on rxe0 and its RDMA counters"

if [[ -n $FAKE_CUDA ]]; then
  t0=$SECONDS
  export GRADLANE_CUDA_LIBRARY=$FAKE_CUDA IT_CHECK_EXTRA=--device=cuda
  it_job_start v3-device gradlane 2 311 -- --quiet "${sizes[@]}"
  it_job_wait v3-device 200 || it_fail "W=3 device tensors over verbs: a rank failed (above)"
  unset GRADLANE_CUDA_LIBRARY IT_CHECK_EXTRA
  python3 - "$metrics" <<'PY' || it_fail "GPUDirect: daemon 0 did not count its device tensors (above)"
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=10).read().decode()
got = {m.group(1): float(m.group(2)) for m in
       re.finditer(r'^gradlane_gpudirect_tensors_total\{result="(\w+)"\} (\S+)$', text, re.M)}
print("  gradlane_gpudirect_tensors_total:", got)
sys.exit(0 if got.get("staged", 0) + got.get("registered", 0) >= 6 else 1)
PY
  grep -m1 "staged through shared memory" "$GL_TMP/daemon0.err" || true
  echo "W=3 device tensors (fake CUDA): bit-exact over verbs, GPU memory offered to the NIC ($((SECONDS - t0)) s)"
fi

it_job_start doomed gradlane 100000 21 -- --expect_failure "${sizes[@]}"
gl_wait_line "$GL_TMP/doomed.r0.out" 'iteration 1 ok' 200 "${GL_PID[doomed.r0]}" ||
  { gl_show doomed.r0; it_fail "job 'doomed' never reached iteration 1"; }
gl_daemon_stop 2 KILL || true
t0=$SECONDS
it_job_wait doomed "$bound" || it_fail "ranks did not all report the failure within ${bound}s (above)"
echo "kill -9 of daemon 2: every rank reported the failure within $((SECONDS - t0)) s"
for i in 0 1; do gl_daemon_alive "$i" || it_fail "daemon $i died after its peer was killed"; done
gl_daemon_start 2 --peer_timeout=${pt}s
it_job_start after gradlane 2 22 -- --quiet "${sizes[@]}"
it_job_wait after 200 || it_fail "a new job after restarting daemon 2 failed (above)"
echo "restarted daemon 2: new job bit-exact over verbs"
# A daemon that stops answering without going away (SIGSTOP: its kernel still answers TCP and
# its NIC still acknowledges): the peers' senders get neither replies nor completions, and must
# fail it within --peer_timeout; its own client learns once it runs again.
it_job_start stalled gradlane 100000 23 -- --expect_failure "${sizes[@]}"
gl_wait_line "$GL_TMP/stalled.r0.out" 'iteration 1 ok' 200 "${GL_PID[stalled.r0]}" ||
  { gl_show stalled.r0; it_fail "job 'stalled' never reached iteration 1"; }
kill -STOP "${GL_DPID[2]}"
t0=$SECONDS
if ! it_job_wait stalled "$bound" "0 1"; then
  kill -CONT "${GL_DPID[2]}"
  it_fail "ranks 0 and 1 did not report the stopped daemon 2 within ${bound}s (above)"
fi
echo "SIGSTOP of daemon 2: ranks 0 and 1 reported the failure within $((SECONDS - t0)) s"
kill -CONT "${GL_DPID[2]}"
it_job_wait stalled 60 2 || it_fail "rank 2 did not report the failure once its daemon ran again"
# Two ranks: the first two hosts' daemons (gl_peers lists the first GL_W).
gl_daemon_stop 2 || it_fail "daemon 2: exit status $? after SIGTERM (want 0)"
GL_W=2
it_job_start v2 bytescheduler 3 41 -- --quiet "${sizes[@]}"
it_job_wait v2 200 || it_fail "W=2 over verbs: a rank failed (above)"
echo "W=2 bytescheduler: 2 ranks x 3 iterations bit-exact over verbs"
for i in 0 1; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS verbs_exact"
