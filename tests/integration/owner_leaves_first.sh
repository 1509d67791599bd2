#!/usr/bin/env bash
# owner_leaves_first: a one-tensor job whose shard owner (rank 0) gets its result first and
# closes at once, while rank 2 registered the job late (after rank 0's first dial to it was
# refused). Rank 0's daemon drains the job: it must still redial rank 2 and send every pull
# response, so ranks 1 and 2 complete instead of failing at the drain deadline. Eight rounds,
# each a new job; each must be bit-exact on every rank.
#   owner_leaves_first.sh GRADLANED GRADLANE-CHECK
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$@"
gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i" --peer_timeout=5s; done
for round in 1 2 3 4 5 6 7 8; do
  name=late$round
  it_job_start "$name" fifo 1 $((60 + round)) "0 1" -- --quiet --dtypes=f32 --sizes=52171
  # Rank 0's daemon dials rank 2 as soon as rank 0 registers; rank 2's daemon does not know
  # the job yet and refuses, so the connection is redialed later.
  sleep 0.5
  it_job_start "$name" fifo 1 $((60 + round)) "2" -- --quiet --dtypes=f32 --sizes=52171
  it_job_wait "$name" 30 || it_fail "round $round: a rank failed (above)"
done
for i in 0 1 2; do gl_daemon_stop "$i" || it_fail "daemon $i: exit status $? after SIGTERM (want 0)"; done
echo "PASS owner_leaves_first ($GL_MODE): 8 jobs whose owner closed first, every rank exact"
