#!/usr/bin/env bash
# two_jobs: two jobs at once on the same three daemons (different policies, seeds, dtypes and
# tensor counts); both must be bit-exact, i.e. the daemons keep jobs apart.
#   two_jobs.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=10s; done
it_job_start jobA p3 30 41 -- --quiet
it_job_start jobB prophet 30 42 -- --quiet --dtypes=bf16,f32 --sizes=1,5,50001,300007
it_job_wait jobA 150 || it_fail "job A failed (above)"
it_job_wait jobB 150 || it_fail "job B failed (above)"
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS two_jobs ($GL_MODE)"
