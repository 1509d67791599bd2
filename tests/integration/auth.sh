#!/usr/bin/env bash
# auth: a job whose rank 2 registers with a different auth token must not run: every rank gets
# a refused registration or error completions within a bounded time (a daemon that ignored the
# token would let all iterations complete: that fails the test). The daemons stay up and a job
# with matching tokens then runs bit-exact.
# A daemon that *rejects* a hello cannot tell a misconfigured rank from a forged hello, so it
# must not fail its job on that alone (anyone could then kill jobs); its ranks fail when the
# peer is not up within the connect deadline, which is shortened here (--connect_timeout=4s).
#   auth.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=2s --connect_timeout=4s; done
good=$IT_TOKEN
it_job_start badtoken bytescheduler 5 31 "0 1" -- --expect_failure
IT_TOKEN="wrong-$good"
it_job_start badtoken bytescheduler 5 31 "2" -- --expect_failure
IT_TOKEN=$good
it_job_wait badtoken 25 || it_fail "a rank of the wrong-token job did not report a failure (above)"
for r in 0 1 2; do
  if grep -q 'iteration [0-9]* ok' "$GL_TMP/badtoken.r$r.out"; then
    gl_show "badtoken.r$r"
    it_fail "rank $r completed an iteration with a mismatched token in the job"
  fi
done
for i in 0 1 2; do gl_daemon_alive "$i" || it_fail "daemon $i died"; done
it_job_start goodtoken fifo 3 32
it_job_wait goodtoken 60 || it_fail "a job with matching tokens failed afterwards (above)"
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS auth ($GL_MODE)"
