#!/usr/bin/env bash
# ops_ctl: gradlanectl against running daemons. While a job of three gradlane-check ranks runs:
#   - status, counters, jobs, peers, queues, bandwidth answer (text and --json) and show the job, its two
#     peers up, its queues per priority class and its estimates;
#   - `trace JOB --iterations 3` writes a Chrome/Perfetto trace that is valid JSON whose spans
#     are nested and ordered (tests/integration/check_trace.py);
#   - bad input gets clear errors: an unknown job, a daemon that is not running, a malformed
#     request on the admin socket (the daemon carries on), bad usage (exit 2).
# After SIGTERM the daemon exits 0 and its admin socket is gone.
#   ops_ctl.sh GRADLANED GRADLANE-CHECK GRADLANECTL CHECK_TRACE.py
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$1" "$2"
CTL=$3 CHECK_TRACE=$4
[[ -x $CTL ]] || it_fail "gradlanectl not built ($CTL)"

gl_env_init 3
for i in 0 1 2; do gl_daemon_start "$i"; done
line=$(grep -m1 'gradlaned: ops metrics=' "$GL_TMP/daemon0.err")
[[ $line =~ admin=([^ ]+) ]] || it_fail "no admin socket in '$line'"
ADMIN=${BASH_REMATCH[1]}
[[ $ADMIN == "${GL_SOCK[0]%.sock}.admin.sock" ]] || it_fail "admin socket $ADMIN is not next to ${GL_SOCK[0]}"
[[ -S $ADMIN ]] || it_fail "admin socket $ADMIN missing"
ctl() { gl_exec 0 "$CTL" --socket="$ADMIN" "$@"; }

# Bad usage and a daemon that is not there, before any job.
rc=0; "$CTL" --socket="$GL_TMP/nothing.sock" status >/dev/null 2>"$GL_TMP/e1" || rc=$?
[[ $rc == 1 ]] && grep -q "gradlaned is not running" "$GL_TMP/e1" || it_fail "no daemon: rc $rc, '$(cat "$GL_TMP/e1")'"
rc=0; "$CTL" --socket="$ADMIN" frobnicate >/dev/null 2>"$GL_TMP/e2" || rc=$?
[[ $rc == 2 ]] && grep -q "unknown command" "$GL_TMP/e2" || it_fail "bad command: rc $rc"
rc=0; "$CTL" --socket="$ADMIN" trace >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || it_fail "trace without a job: rc $rc, want 2"
rc=0; ctl trace no-such-job --iterations 1 >/dev/null 2>"$GL_TMP/e3" || rc=$?
[[ $rc == 1 ]] && grep -q "no active job 'no-such-job'" "$GL_TMP/e3" || it_fail "unknown job: rc $rc, '$(cat "$GL_TMP/e3")'"
# A malformed request: an error answer, and the daemon carries on.
ans=$(gl_exec 0 python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{not json\n")
print(s.makefile().readline().strip())' "$ADMIN")
[[ $ans == *'"ok":false'* && $ans == *'not valid JSON'* ]] || it_fail "malformed request answered '$ans'"
ctl status | grep -q "^engine *running" || it_fail "status after a malformed request"
echo "errors: no daemon, bad command, unknown job, malformed request -> clear messages"

# A job long enough to watch: many small iterations.
it_job_start ctl bytescheduler 400 5 -- --quiet --dtypes=f32,bf16 --sizes=1000,50001,300001
# Wait until it has run a few iterations.
for ((k = 0; k < 200; k++)); do
  it=$(ctl --json jobs | python3 -c 'import json,sys
j=[x for x in json.load(sys.stdin)["jobs"] if x["job"]=="ctl"]; print(j[0].get("iteration",-1) if j else -1)')
  ((it >= 3)) && break
  sleep 0.1
done
((it >= 3)) || it_fail "job ctl did not reach iteration 3 (at $it)"

for c in status counters jobs peers queues bandwidth; do
  echo "\$ gradlanectl $c"
  ctl "$c" | tee "$GL_TMP/ctl-$c.txt"
done
grep -Eq '^jobs +1 active' "$GL_TMP/ctl-status.txt" || it_fail "status: not 1 active job"
grep -Eq '^ctl +0/3 +bytescheduler +ps +active' "$GL_TMP/ctl-jobs.txt" || it_fail "jobs: no active 'ctl 0/3 bytescheduler ps'"
# counters: every counter of the lists (daemon/engine_counters.h, transport/counters.h; the
# transport's per-peer totals prefixed transport_), one line each, with a number.
want=$(python3 - "$here/../../daemon/engine_counters.h" "$here/../../transport/counters.h" <<'PY'
import re, sys
names = []
for path in sys.argv[1:]:
    text = open(path).read()
    for macro, body in re.findall(r"#define (GRADLANE_\w+_COUNTERS)\(X\)(.*?)\n\n", text, re.S):
        prefix = "transport_" if macro == "GRADLANE_PEER_COUNTERS" else ""
        names += [prefix + n for n in re.findall(r"\bX\((\w+),", body)]
print("\n".join(sorted(names)))
PY
)
got=$(awk '$2 ~ /^[0-9]+$/ {print $1}' "$GL_TMP/ctl-counters.txt" | sort)
[[ $(wc -l <<<"$want") -ge 20 && $want == "$got" ]] ||
  it_fail "counters: want one numeric line per declared counter ($(echo $want)); got: $(echo $got)"
grep -Eq '^jobs_active +1 ' "$GL_TMP/ctl-counters.txt" || it_fail "counters: jobs_active is not 1"
grep -Eq '^posts_completed +[1-9][0-9]* ' "$GL_TMP/ctl-counters.txt" || it_fail "counters: no completed post"
[[ $(grep -Ec "^ctl +1 +${GL_ADDR[1]} |^ctl +2 +${GL_ADDR[2]} " "$GL_TMP/ctl-peers.txt") == 2 ]] ||
  it_fail "peers: want ranks 1 and 2 at their addresses"
[[ $(grep -Ec ' up ' "$GL_TMP/ctl-peers.txt") == 2 ]] || it_fail "peers: want both up"
[[ $(grep -Ec '^  (0|1|2-3|4-7|8-15|16-31|32-63|64\+) ' "$GL_TMP/ctl-queues.txt") -ge 16 ]] ||
  it_fail "queues: want 8 priority classes for the job and 8 delay rows"
grep -Eq '^ctl +[0-9.]+ Gbit/s' "$GL_TMP/ctl-bandwidth.txt" || it_fail "bandwidth: no estimate for ctl"
# The JSON form carries the same facts.
ctl --json peers | python3 -c 'import json,sys
p=json.load(sys.stdin)["peers"]; assert len(p)==2 and all(x["state"]=="up" and x["bytes_sent"]>0 for x in p), p' ||
  it_fail "peers --json"

echo "\$ gradlanectl trace ctl --iterations 3"
ctl trace ctl --iterations 3 --out "$GL_TMP/trace.json" | tee "$GL_TMP/ctl-trace.txt"
grep -q "(iterations [0-9]*\.\.[0-9]* of job ctl; complete)" "$GL_TMP/ctl-trace.txt" || it_fail "trace summary"
python3 "$CHECK_TRACE" "$GL_TMP/trace.json" --iterations 3 --peers 2 || it_fail "trace check"

# A second client asking for a trace while one runs is refused; the first still completes.
gl_bg 0 tr1 "$CTL" --socket="$ADMIN" trace ctl --iterations 40 --out "$GL_TMP/trace1.json"
for ((k = 0; k < 100; k++)); do
  ctl --json status | grep -q '"tracing": "ctl"' && break
  ((k < 99)) || it_fail "the first trace never showed in status"
  sleep 0.05
done
rc=0; ctl trace ctl --iterations 1 --out "$GL_TMP/trace2.json" 2>"$GL_TMP/e4" >/dev/null || rc=$?
gl_wait tr1 60 || it_fail "first trace failed: $(cat "$GL_TMP/tr1.err")"
[[ $rc == 1 ]] && grep -q "already being recorded" "$GL_TMP/e4" || it_fail "concurrent trace: rc $rc '$(cat "$GL_TMP/e4")'"
python3 "$CHECK_TRACE" "$GL_TMP/trace1.json" --iterations 40 --peers 2 || it_fail "trace1 check"

it_job_wait ctl 240 || it_fail "job ctl failed (above)"
gl_daemon_stop 0 || it_fail "daemon 0: exit status $? after SIGTERM (want 0)"
[[ ! -e $ADMIN ]] || it_fail "admin socket left behind after SIGTERM"
echo "PASS ops_ctl ($GL_MODE)"
