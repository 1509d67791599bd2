#!/usr/bin/env bash
# verbs_exact: parameter-server jobs over the RDMA verbs transport (--transport=verbs), run inside
# tests/rxe's QEMU guest where soft-RoCE (rxe0 on lo) is the device and every daemon listens on
# 127.0.0.1. Three daemons: gradlane and fifo jobs, every result bit-exact (small segments go
# eagerly with their header, the rest by RDMA WRITE with immediate); then two daemons. Then the
# flush case: kill -9 of one daemon mid-job; the other ranks must get error completions (their
# queue pairs flush, the TCP connections reset) within the bound, the survivors stay up, and a
# job on a restarted daemon is bit-exact.
#   verbs_exact.sh GRADLANED GRADLANE-CHECK     (inside the guest: tests/rxe/rxe-guest.sh -- ...)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
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
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=${pt}s; done
seed=300
for policy in gradlane fifo; do
  seed=$((seed + 1))
  t0=$SECONDS
  it_job_start "v3-$policy" "$policy" 3 "$seed" -- --quiet "${sizes[@]}"
  it_job_wait "v3-$policy" 200 || it_fail "W=3 $policy over verbs: a rank failed (above)"
  echo "W=3 $policy: 3 ranks x 3 iterations bit-exact over verbs ($((SECONDS - t0)) s)"
done

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
# Two ranks: the first two hosts' daemons (gl_peers lists the first GL_W).
gl_daemon_stop 2 || it_fail "daemon 2: exit status $? after SIGTERM (want 0)"
GL_W=2
it_job_start v2 bytescheduler 3 41 -- --quiet "${sizes[@]}"
it_job_wait v2 200 || it_fail "W=2 over verbs: a rank failed (above)"
echo "W=2 bytescheduler: 2 ranks x 3 iterations bit-exact over verbs"
for i in 0 1; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS verbs_exact"
