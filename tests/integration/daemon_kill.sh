#!/usr/bin/env bash
# daemon_kill: `kill -9` of one host's daemon while a job runs (--peer_timeout=2s). The ranks
# on the other hosts must get error completions within the timeout (bounded here by
# 2 x peer_timeout + 3 s), the dead daemon's own client must see the disconnect, the other
# daemons stay up; the daemon is restarted and a new job must run bit-exact.
# With network namespaces, also a *silent* peer: host 2's link goes down mid-job (no RST, no
# FIN); the others must fail within the same bound.
#   daemon_kill.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
gl_env_init 3
pt=2
bound=$((2 * pt + 3))
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=${pt}s; done

it_job_start doomed fifo 100000 21 -- --expect_failure
gl_wait_line "$GL_TMP/doomed.r0.out" 'iteration 3 ok' 60 "${GL_PID[doomed.r0]}" ||
  { gl_show doomed.r0; it_fail "job never reached iteration 3"; }
gl_daemon_stop 2 KILL || true
t0=$SECONDS
it_job_wait doomed "$bound" || it_fail "ranks did not all report the failure within ${bound}s (above)"
echo "all ranks reported the failure $((SECONDS - t0)) s after kill -9 of daemon 2"
for i in 0 1; do gl_daemon_alive "$i" || it_fail "daemon $i died after its peer was killed"; done

gl_daemon_start 2 --peer_timeout=${pt}s
it_job_start after prophet 5 22
it_job_wait after 60 || it_fail "a new job after restarting daemon 2 failed (above)"
echo "restarted daemon 2; new job bit-exact"

if [[ $GL_MODE == netns ]]; then
  it_job_start silent bytescheduler 100000 23 -- --expect_failure
  gl_wait_line "$GL_TMP/silent.r0.out" 'iteration 3 ok' 60 "${GL_PID[silent.r0]}" ||
    { gl_show silent.r0; it_fail "job 'silent' never reached iteration 3"; }
  ip -n "${GL_NS[2]}" link set eth0 down
  t0=$SECONDS
  it_job_wait silent "$bound" "0 1" || it_fail "ranks 0,1 did not fail within ${bound}s of host 2 going silent"
  echo "ranks 0,1 reported the silent peer $((SECONDS - t0)) s after its link went down"
  it_job_wait silent "$bound" "2" || it_fail "rank 2 (cut off) did not fail within ${bound}s"
  for i in 0 1 2; do gl_daemon_alive "$i" || it_fail "daemon $i died in the silent-peer test"; done
else
  echo "(loopback: silent-peer part skipped, it needs network namespaces)"
fi
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS daemon_kill ($GL_MODE)"
