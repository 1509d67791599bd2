#!/usr/bin/env bash
# client_kill: `kill -9` of one training process in the middle of an iteration (it posted half
# of its ranges of iteration 3). The other ranks, blocked on that iteration, must get error
# completions within a bounded time (not hang), iterations 0-2 must have been bit-exact, every
# daemon must stay up, and a new job on the same daemons must then run bit-exact.
#   client_kill.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=2s; done

it_job_start victim bytescheduler 20 11 "0 1" -- --expect_failure
it_job_start victim bytescheduler 20 11 "2" -- --stall_at=3
gl_wait_line "$GL_TMP/victim.r2.out" 'stalled at iteration 3' 60 "${GL_PID[victim.r2]}" ||
  { gl_show victim.r2; it_fail "rank 2 never reached its stall point"; }
sleep 0.5  # let the half-posted ranges reach the shards
for r in 0 1; do
  kill -0 "${GL_PID[victim.r$r]}" 2>/dev/null ||
    { gl_show "victim.r$r"; it_fail "rank $r finished before rank 2 was killed"; }
done
kill -KILL "${GL_PID[victim.r2]}"
t0=$SECONDS
gl_wait victim.r2 5 || true
it_job_wait victim 25 "0 1" || it_fail "surviving ranks did not report the failure (above)"
for r in 0 1; do
  grep -q 'EXPECTED-FAILURE .*iteration=3 ' "$GL_TMP/victim.r$r.out" ||
    { gl_show "victim.r$r"; it_fail "rank $r: failure not in iteration 3"; }
done
echo "survivors got error completions $((SECONDS - t0)) s after the kill"
for i in 0 1 2; do gl_daemon_alive "$i" || it_fail "daemon $i died after a client was killed"; done

it_job_start after p3 5 12
it_job_wait after 60 || it_fail "a new job after the kill failed (above)"
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS client_kill ($GL_MODE)"
