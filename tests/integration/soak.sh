#!/usr/bin/env bash
# soak: a bounded chaos soak (issue #16). Three daemons; a driver keeps 2-3 jobs of three
# gradlane-check ranks running (unique job ids, random policy, a few iterations, modest sizes)
# and, at random intervals, injects one fault at a time:
#   client_kill        kill -9 of one rank of a running job
#   client_stop_cont   SIGSTOP of one rank for 1-4 s, then SIGCONT
#   client_stop_kill   SIGSTOP of one rank for 1-3 s, then kill -9
#   daemon_kill        kill -9 of daemon 1 or 2, restarted at once (same host, new port)
#   daemon_stop_short  SIGSTOP of a daemon for less than --peer_timeout, then SIGCONT
#   daemon_stop_long   SIGSTOP of a daemon for 1-4 s more than --peer_timeout, then SIGCONT
# Daemon 0 is never killed (only stopped), so at least one daemon lives through the whole run
# and its fds and RSS can be compared with its baseline.
# Phase 1 runs over TCP; phase 2 over DPDK (net_af_packet, namespaces) with every daemon
# also dropping 1% and reordering 2% of its datagrams (--dpdk_drop_probability,
# --dpdk_reorder_probability); phase 2 is skipped, saying so, when gradlaned has no DPDK
# (SOAK_DPDK=0) or namespaces cannot be made.
#
# Judged after the fact, per job: a job that no fault touched (none ran while it did, nor
# within --peer_timeout + 1 s after a daemon fault ended) must be bit-exact OK on every rank.
# A touched job's ranks may each be OK, killed by the driver, or fail with an error the client
# was given (error completion, a refused post/wait/registration, a refused connect while its
# daemon was down) — never a hang ("timed out: no completion", or no progress on any rank for
# SOAK_HANG_S: killed, exit 124), never a mismatch, never an unexplained exit. No daemon may
# die unless the driver killed it. At the end, after every job has ended, each daemon that
# was never restarted must be back at its baseline fd count (exactly; measured after six
# quiet warm-up jobs); its RssAnon (heap, stacks) within SOAK_RSS_SLACK_KB (default 8192) + 25% of its
# baseline (allocator caches, high-water marks); over TCP its RssShmem (the clients' arenas)
# within SOAK_RSS_SLACK_KB of baseline (over DPDK RssShmem is the EAL memory, touched lazily
# up to --dpdk_memory_mb: reported, not judged); and it must exit 0 on SIGTERM.
#
#   soak.sh GRADLANED GRADLANE-CHECK
#   SOAK_SECONDS=600 (the whole run; split between the phases)  SOAK_SEED=N (reproducible
#   choices)  SOAK_DPDK=0|1  SOAK_KEEP_LOGS=DIR (copy every log there at the end)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/netns.sh"
source "$here/common.sh"
it_init "$1" "$2"

SOAK_SECONDS=${SOAK_SECONDS:-600}
SOAK_SEED=${SOAK_SEED:-$((RANDOM * 32768 + RANDOM))}
SOAK_HANG_S=${SOAK_HANG_S:-60}
SOAK_RSS_SLACK_KB=${SOAK_RSS_SLACK_KB:-8192}
PT=3                 # --peer_timeout, seconds
IT_CLIENT_TIMEOUT_MS=30000

if [[ -z ${SOAK_PHASE:-} ]]; then
  # The parent: one child process per phase (each makes and removes its own hosts).
  echo "soak: ${SOAK_SECONDS}s, seed $SOAK_SEED, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  phases=(tcp)
  if [[ ${SOAK_DPDK:-0} == 1 ]]; then
    phases+=(dpdk)
  else
    echo "soak: DPDK phase skipped: gradlaned was built without DPDK (meson -Ddpdk=enabled)"
  fi
  per=$((SOAK_SECONDS / ${#phases[@]}))
  rc_all=0 k=0
  for p in "${phases[@]}"; do
    k=$((k + 1))
    SOAK_PHASE=$p SOAK_PHASE_SECONDS=$per SOAK_SEED=$((SOAK_SEED + k)) bash "$0" "$@"
    rc=$?
    if ((rc == 77)); then
      echo "soak: phase $p skipped (above)"
    elif ((rc != 0)); then
      echo "soak: phase $p FAILED (exit $rc)"
      rc_all=1
    fi
  done
  echo "soak: load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  ((rc_all == 0)) && echo "PASS soak" || echo "FAIL soak"
  exit "$rc_all"
fi

PHASE=$SOAK_PHASE
DURATION=${SOAK_PHASE_SECONDS:-$SOAK_SECONDS}
RANDOM=$SOAK_SEED
if [[ $PHASE == dpdk ]]; then
  GL_TRANSPORT=dpdk
  GL_DPDK_FLAGS="--dpdk_drop_probability=0.01 --dpdk_reorder_probability=0.02"
fi
gl_env_init 3
POLICIES=(fifo p3 bytescheduler prophet gradlane)
SIZES="--sizes=1,1023,50001,300001"
say() { echo "[soak $PHASE +$(( (NOW_MS - T0_MS) / 1000 ))s] $*"; }
now_ms() { local t=${EPOCHREALTIME/./}; NOW_MS=$((10#$t / 1000)); }
rand() { echo $((RANDOM % ($2 - $1 + 1) + $1)); }  # rand LO HI (inclusive)

declare -a RESTARTS=(0 0 0) STOPPED=(0 0 0)
DSEED=0
daemon_up() {  # I
  local i=$1
  DSEED=$((DSEED + 1))
  local extra=()
  [[ $PHASE == dpdk ]] && extra=(--dpdk_fault_seed=$((i * 1000 + DSEED)))
  # Ended jobs leave the daemon's telemetry 2 s after they end (default 300 s, for gradlanectl):
  # what is still held at the end is then the daemon's, not the retention's.
  gl_daemon_start "$i" --peer_timeout=${PT}s --connect_timeout=10s --job_retention=2s "${extra[@]}"
}
fds_of() { local n; n=$(ls "/proc/$1/fd" 2>/dev/null | wc -l); echo "$n"; }
# "VmRSS RssAnon RssShmem" in kB. RssAnon is the daemon's own heap and stacks; RssShmem holds
# the clients' arenas while their jobs run and, over DPDK, the EAL memory (--no-huge: a memfd
# of --dpdk_memory_mb, touched lazily as mbufs are first used).
mem_of() { awk '/^VmRSS:/ {r=$2} /^RssAnon:/ {a=$2} /^RssShmem:/ {s=$2} END {print r, a, s}' "/proc/$1/status" 2>/dev/null; }

FAILS=0
problem() { say "PROBLEM: $*"; FAILS=$((FAILS + 1)); }

# ----------------------------------------------------------------------------- jobs ---
declare -A J_START=() J_END=() J_POLICY=() J_TOUCH=() J_SEEN=() J_PROG=() J_KILLED=() J_RC=()
RUNNING=""           # names of running jobs
NJOBS=0 JOBS_OK=0 JOBS_FAILED=0 BYTES=0 COMPLETIONS=0 RANKS_OK=0 ERRORS=0 HANGS=0 KILLED=0
CORRUPT=0 UNEXPLAINED=0 UNTOUCHED_OK=0 TOUCHED_OK=0 TOUCHED_FAILED=0
TAINT_UNTIL=0        # jobs running before this time (ms) are touched by the last daemon fault
TAINT_ID=""

job_start() {
  NJOBS=$((NJOBS + 1))
  local name="soak-$PHASE-$NJOBS" pol=${POLICIES[RANDOM % ${#POLICIES[@]}]} iters
  iters=$(rand 2 6)
  it_job_start "$name" "$pol" "$iters" "$RANDOM" -- --quiet "$SIZES"
  J_START[$name]=$NOW_MS J_POLICY[$name]=$pol J_TOUCH[$name]="" J_SEEN[$name]="" J_PROG[$name]=$NOW_MS
  J_KILLED[$name]=""
  RUNNING+=" $name"
  # A job started while a daemon fault is still settling is touched by it.
  if [[ $F_ACTIVE == daemon_* ]]; then J_TOUCH[$name]+=" $F_ID"
  elif ((NOW_MS < TAINT_UNTIL)); then J_TOUCH[$name]+=" $TAINT_ID"; fi
}

touch_running() {  # FAULT_ID: every running job is touched
  local j
  for j in $RUNNING; do J_TOUCH[$j]+=" $1"; done
}

rank_alive() { [[ -n ${GL_PID[$1]:-} ]] && kill -0 "${GL_PID[$1]}" 2>/dev/null; }

# Classifies one ended rank: ok | killed | error | hang | corrupt | unexplained (+ reason).
classify_rank() {  # JOB RANK RC
  local j=$1 r=$2 rc=$3 out="$GL_TMP/$1.r$2.out" err="$GL_TMP/$1.r$2.err"
  if ((rc == 124)); then echo "hang (no progress for ${SOAK_HANG_S}s: killed by the driver)"; return; fi
  if [[ " ${J_KILLED[$j]} " == *" $r "* ]]; then echo "killed"; return; fi
  if ((rc == 0)) && grep -q '^gradlane-check: OK ' "$out"; then echo "ok"; return; fi
  if grep -qE 'MISMATCH|second completion|unknown user_data|names tensor' "$err"; then
    echo "corrupt ($(grep -m1 -E 'MISMATCH|second completion|unknown user_data|names tensor' "$err"))"; return
  fi
  if grep -q 'timed out: no completion' "$err"; then echo "hang ($(grep -m1 'timed out' "$err"))"; return; fi
  if ((rc == 1)) && grep -qE 'error completion|gl_wait: |gl_post: |gl_register_tensor|set-up failed|gl_connect|gl_register_job' "$err"; then
    echo "error ($(grep -m1 -E 'error completion|gl_wait: |gl_post: |gl_register_tensor|gl_connect|gl_register_job|set-up failed' "$err" | cut -c1-200))"
    return
  fi
  echo "unexplained (exit $rc: $(tail -n 2 "$err" | tr '\n' ' ' | cut -c1-200))"
}

job_finish() {  # JOB : every rank has ended
  local j=$1 r rc cls kind ok=1 line
  J_END[$j]=$NOW_MS
  local verdicts=""
  for r in 0 1 2; do
    rc=${J_RC[$j.$r]}
    cls=$(classify_rank "$j" "$r" "$rc")
    kind=${cls%% *}
    verdicts+=" r$r=$kind"
    case $kind in
      ok)
        RANKS_OK=$((RANKS_OK + 1))
        line=$(grep -m1 '^gradlane-check: OK ' "$GL_TMP/$j.r$r.out")
        [[ $line =~ bytes-checked=([0-9]+) ]] && BYTES=$((BYTES + BASH_REMATCH[1]))
        [[ $line =~ completions=([0-9]+) ]] && COMPLETIONS=$((COMPLETIONS + BASH_REMATCH[1]))
        ;;
      killed) KILLED=$((KILLED + 1)); ok=0 ;;
      error) ERRORS=$((ERRORS + 1)); ok=0 ;;
      hang) HANGS=$((HANGS + 1)); ok=0; problem "job $j rank $r: $cls" ;;
      corrupt) CORRUPT=$((CORRUPT + 1)); ok=0; problem "job $j rank $r: $cls" ;;
      *) UNEXPLAINED=$((UNEXPLAINED + 1)); ok=0; problem "job $j rank $r: $cls" ;;
    esac
    [[ $kind == error || $kind == unexplained ]] && echo "    $j r$r: $cls" >>"$GL_TMP/soak-errors.txt"
  done
  if ((ok)); then JOBS_OK=$((JOBS_OK + 1)); else JOBS_FAILED=$((JOBS_FAILED + 1)); fi
  if [[ -z ${J_TOUCH[$j]// /} ]]; then
    if ((ok)); then UNTOUCHED_OK=$((UNTOUCHED_OK + 1)); else
      problem "job $j (${J_POLICY[$j]}) was touched by no fault but did not succeed:$verdicts"
      for r in 0 1 2; do gl_show "$j.r$r" 6 2>&1 | sed 's/^/    /'; done
    fi
  else
    if ((ok)); then TOUCHED_OK=$((TOUCHED_OK + 1)); else TOUCHED_FAILED=$((TOUCHED_FAILED + 1)); fi
  fi
  say "job $j ${J_POLICY[$j]} ended after $(( (NOW_MS - J_START[$j]) / 1000 ))s:$verdicts${J_TOUCH[$j]:+ (faults${J_TOUCH[$j]})}"
}

poll_jobs() {
  local j r running now still=""
  for j in $RUNNING; do
    running=0
    now=""
    for r in 0 1 2; do
      if rank_alive "$j.r$r"; then
        running=1
      elif [[ -n ${GL_PID[$j.r$r]:-} ]]; then
        rc=0
        wait "${GL_PID[$j.r$r]}" 2>/dev/null || rc=$?
        J_RC[$j.$r]=$rc
        unset "GL_PID[$j.r$r]"
      fi
      now+=$(cat "$GL_TMP/$j.r$r.progress" 2>/dev/null)"|"
    done
    if ((running)); then
      if [[ $now != "${J_SEEN[$j]}" ]]; then J_SEEN[$j]=$now J_PROG[$j]=$NOW_MS; fi
      if ((NOW_MS - J_PROG[$j] > SOAK_HANG_S * 1000)) && ! fault_holds_job "$j"; then
        say "job $j: no progress on any rank for ${SOAK_HANG_S}s: killing its ranks"
        for r in 0 1 2; do
          if [[ -n ${GL_PID[$j.r$r]:-} ]]; then
            kill -CONT "${GL_PID[$j.r$r]}" 2>/dev/null
            gl_kill_pid "${GL_PID[$j.r$r]}" 1
            unset "GL_PID[$j.r$r]"
            J_RC[$j.$r]=124
          fi
        done
        job_finish "$j"
      else
        still+=" $j"
      fi
    else
      job_finish "$j"
    fi
  done
  RUNNING=$still
}

# ----------------------------------------------------------------------------- faults ---
declare -A F_COUNT=()
NFAULTS=0
F_ACTIVE=""          # kind of the fault in progress ("" none)
F_RESUME_AT=0 F_TARGET="" F_JOB="" F_ID=""
fault_holds_job() { [[ -n $F_ACTIVE && ( $F_ACTIVE == daemon_* || $F_JOB == "$1" ) ]]; }

check_daemons() {
  local i
  for i in 0 1 2; do
    if ! gl_daemon_alive "$i"; then
      problem "daemon $i (pid ${GL_DPID[i]}) died without being killed by the driver; restarting it"
      cp "$GL_TMP/daemon$i.err" "$GL_TMP/daemon$i.died$NOW_MS.err" 2>/dev/null
      tail -n 20 "$GL_TMP/daemon$i.err" | sed 's/^/    /'
      wait "${GL_DPID[i]}" 2>/dev/null
      GL_DPID[i]=""
      RESTARTS[i]=$((RESTARTS[i] + 1))
      daemon_up "$i" || { problem "daemon $i did not restart"; return 1; }
    fi
  done
}

pick_rank() {  # sets F_JOB, F_TARGET (a live rank of a running job); 1 if none
  local jobs=($RUNNING) j r
  ((${#jobs[@]})) || return 1
  j=${jobs[RANDOM % ${#jobs[@]}]}
  r=$((RANDOM % 3))
  rank_alive "$j.r$r" || return 1
  F_JOB=$j F_TARGET=$r
}

inject() {
  local kinds=(client_kill client_stop_cont client_stop_kill daemon_kill daemon_stop_short daemon_stop_long)
  local kind=${kinds[RANDOM % ${#kinds[@]}]} d
  F_ID="f$((NFAULTS + 1))"
  case $kind in
    client_*)
      pick_rank || return 1
      J_TOUCH[$F_JOB]+=" $F_ID"
      local pid=${GL_PID[$F_JOB.r$F_TARGET]}
      if [[ $kind == client_kill ]]; then
        J_KILLED[$F_JOB]+=" $F_TARGET"
        kill -KILL "$pid" 2>/dev/null
        say "$F_ID client_kill: job $F_JOB rank $F_TARGET (pid $pid)"
      else
        kill -STOP "$pid" 2>/dev/null
        d=$(rand 1000 $([[ $kind == client_stop_cont ]] && echo 4000 || echo 3000))
        F_ACTIVE=$kind F_RESUME_AT=$((NOW_MS + d))
        say "$F_ID $kind: job $F_JOB rank $F_TARGET (pid $pid) stopped for ${d}ms"
      fi
      ;;
    daemon_kill)
      d=$(rand 1 2)
      touch_running "$F_ID"
      say "$F_ID daemon_kill: daemon $d (pid ${GL_DPID[d]}); jobs running:${RUNNING:- none}"
      cp "$GL_TMP/daemon$d.err" "$GL_TMP/daemon$d.run${RESTARTS[d]}.err" 2>/dev/null
      gl_daemon_stop "$d" KILL
      RESTARTS[d]=$((RESTARTS[d] + 1))
      if ! daemon_up "$d"; then problem "daemon $d did not restart after kill -9"; return 0; fi
      now_ms
      TAINT_UNTIL=$((NOW_MS + (PT + 1) * 1000)) TAINT_ID=$F_ID
      say "$F_ID daemon $d restarted (pid ${GL_DPID[d]}, ${GL_ADDR[d]})"
      ;;
    daemon_stop_short|daemon_stop_long)
      d=$((RANDOM % 3))
      if [[ $kind == daemon_stop_short ]]; then d2=$(rand 300 $((PT * 1000 - 1000))); else
        d2=$(rand $((PT * 1000 + 1000)) $((PT * 1000 + 4000))); fi
      touch_running "$F_ID"
      kill -STOP "${GL_DPID[d]}"
      STOPPED[d]=1
      F_ACTIVE=$kind F_TARGET=$d F_RESUME_AT=$((NOW_MS + d2))
      say "$F_ID $kind: daemon $d (pid ${GL_DPID[d]}) stopped for ${d2}ms; jobs running:${RUNNING:- none}"
      ;;
  esac
  NFAULTS=$((NFAULTS + 1))
  F_COUNT[$kind]=$((${F_COUNT[$kind]:-0} + 1))
  return 0
}

resume() {
  local pid
  case $F_ACTIVE in
    client_stop_cont|client_stop_kill)
      pid=${GL_PID[$F_JOB.r$F_TARGET]:-}
      if [[ -n $pid ]]; then
        if [[ $F_ACTIVE == client_stop_kill ]]; then
          J_KILLED[$F_JOB]+=" $F_TARGET"
          kill -KILL "$pid" 2>/dev/null
        fi
        kill -CONT "$pid" 2>/dev/null
      fi
      say "$F_ID ends: job $F_JOB rank $F_TARGET $([[ $F_ACTIVE == client_stop_kill ]] && echo killed || echo continued)"
      ;;
    daemon_stop_*)
      kill -CONT "${GL_DPID[F_TARGET]}" 2>/dev/null
      STOPPED[F_TARGET]=0
      TAINT_UNTIL=$((NOW_MS + (PT + 1) * 1000)) TAINT_ID=$F_ID
      say "$F_ID ends: daemon $F_TARGET continued"
      ;;
  esac
  F_ACTIVE=""
}

# ------------------------------------------------------------------------------ run ---
now_ms
T0_MS=$NOW_MS
for i in 0 1 2; do daemon_up "$i" || it_fail "daemon $i did not start"; done
say "$GL_MODE, transport ${GL_TRANSPORT:-tcp}${GL_DPDK_FLAGS:+ ($GL_DPDK_FLAGS)}, ${DURATION}s, seed $SOAK_SEED, peer_timeout ${PT}s"

# Baseline: two rounds of three quiet jobs (every policy; the allocator reaches its working
# size), then the daemons' fds and memory once they have settled.
for round in 1 2; do
  for k in 0 1 2; do
    it_job_start "soak-$PHASE-warm$round$k" "${POLICIES[(3 * (round - 1) + k) % ${#POLICIES[@]}]}" 3 "$round$k" -- --quiet "$SIZES"
  done
  for k in 0 1 2; do
    it_job_wait "soak-$PHASE-warm$round$k" "$SOAK_HANG_S" || it_fail "a quiet warm-up job failed (above)"
  done
done
sleep 2
declare -a FD0=() MEM0=() PID0=()
for i in 0 1 2; do
  PID0[i]=${GL_DPID[i]} FD0[i]=$(fds_of "${GL_DPID[i]}") MEM0[i]=$(mem_of "${GL_DPID[i]}")
  say "baseline daemon $i: fds ${FD0[i]}, VmRSS/RssAnon/RssShmem ${MEM0[i]// //} kB"
done

now_ms
DEADLINE=$((NOW_MS + DURATION * 1000))
NEXT_FAULT=$((NOW_MS + $(rand 2000 6000)))
WANT=$(rand 2 3)
while :; do
  now_ms
  poll_jobs
  ((NOW_MS >= DEADLINE)) && break
  if [[ -n $F_ACTIVE ]]; then
    if ((NOW_MS >= F_RESUME_AT)); then
      resume
      NEXT_FAULT=$((NOW_MS + $(rand 2000 8000)))
    fi
  elif ((NOW_MS >= NEXT_FAULT)); then
    if inject; then
      [[ -z $F_ACTIVE ]] && NEXT_FAULT=$((NOW_MS + $(rand 2000 8000)))
    else
      NEXT_FAULT=$((NOW_MS + 500))   # nothing to hit right now
    fi
  fi
  [[ -z $F_ACTIVE ]] && check_daemons
  now_ms
  if ((NOW_MS < DEADLINE)); then
    n=($RUNNING)
    if ((${#n[@]} < WANT)); then
      job_start
      WANT=$(rand 2 3)
    fi
  fi
  sleep 0.2
done

# Drain: end the fault in progress, let every job end (each is bounded by SOAK_HANG_S).
now_ms
[[ -n $F_ACTIVE ]] && resume
say "deadline: no new jobs or faults; waiting for:${RUNNING:- nothing}"
while [[ -n ${RUNNING// /} ]]; do
  now_ms
  poll_jobs
  sleep 0.2
done
now_ms
check_daemons

# Resources of the daemons that lived through the whole phase, once the last jobs' telemetry
# has been let go (--job_retention=2s).
sleep 3
RES_LINES=()
for i in 0 1 2; do
  if ((RESTARTS[i] > 0)) || [[ ${GL_DPID[i]} != "${PID0[i]}" ]]; then
    RES_LINES+=("daemon $i: restarted ${RESTARTS[i]}x, not compared (fds ${FD0[i]} -> $(fds_of "${GL_DPID[i]}") in its latest run)")
    continue
  fi
  fd1=0
  for ((k = 0; k < 100; k++)); do   # jobs linger 200 ms after they end; connections close
    fd1=$(fds_of "${GL_DPID[i]}")
    ((fd1 == FD0[i])) && break
    sleep 0.1
  done
  read -r r0 a0 s0 <<<"${MEM0[i]}"
  read -r r1 a1 s1 <<<"$(mem_of "${GL_DPID[i]}")"
  allow=$((a0 + SOAK_RSS_SLACK_KB + a0 / 4))
  verdict=ok
  if ((fd1 != FD0[i])); then
    problem "daemon $i: $fd1 fds after the soak, ${FD0[i]} at baseline"
    ls -l "/proc/${GL_DPID[i]}/fd" | sed 's/^/    /' | tail -n 40
  fi
  if ((a1 > allow)); then
    verdict="GROWTH"
    problem "daemon $i: RssAnon $a0 kB -> $a1 kB (allowed $allow kB)"
  fi
  # Without DPDK, shared memory is only the clients' arenas: gone once the jobs are.
  ash=$((s0 + SOAK_RSS_SLACK_KB))
  if [[ $PHASE != dpdk ]] && ((s1 > ash)); then
    verdict="GROWTH"
    problem "daemon $i: RssShmem $s0 kB -> $s1 kB (allowed $ash kB): client arenas still mapped?"
  fi
  ((fd1 != FD0[i])) && verdict="FD LEAK"
  RES_LINES+=("daemon $i: fds ${FD0[i]} -> $fd1; RssAnon $a0 -> $a1 kB (allowed <= $allow); RssShmem $s0 -> $s1 kB$([[ $PHASE == dpdk ]] && echo " (EAL memory, bounded by --dpdk_memory_mb)"); VmRSS $r0 -> $r1 kB: $verdict")
done

DPDK_LINES=()
for i in 0 1 2; do
  rc=0
  gl_daemon_stop "$i" || rc=$?
  ((rc == 0)) || problem "daemon $i: exit status $rc after SIGTERM (want 0)"
  if [[ $PHASE == dpdk ]]; then
    line=$(grep -m1 'dpdk stats:' "$GL_TMP/daemon$i.err")
    DPDK_LINES+=("daemon $i (last run): ${line#*dpdk stats: }")
  fi
done

fk=""
for k in client_kill client_stop_cont client_stop_kill daemon_kill daemon_stop_short daemon_stop_long; do
  fk+=" $k=${F_COUNT[$k]:-0}"
done
echo "== soak $PHASE summary (${DURATION}s, seed $SOAK_SEED, load average $(cut -d' ' -f1-3 /proc/loadavg))"
echo "jobs: started $NJOBS, all ranks OK $JOBS_OK, failed $JOBS_FAILED (untouched: $UNTOUCHED_OK OK; touched by a fault: $TOUCHED_OK OK, $TOUCHED_FAILED failed)"
echo "faults injected: $NFAULTS:$fk"
echo "results checked: $RANKS_OK rank runs bit-exact, $COMPLETIONS completions, $BYTES bytes verified"
echo "errors delivered: $ERRORS ranks ended with an error; $KILLED ranks killed by the driver"
echo "hangs: $HANGS  mismatches: $CORRUPT  unexplained: $UNEXPLAINED"
for l in "${RES_LINES[@]}"; do echo "$l"; done
for l in "${DPDK_LINES[@]}"; do echo "$l"; done
if [[ -s $GL_TMP/soak-errors.txt ]]; then
  echo "errors the clients reported (by kind):"
  grep -oE 'error completion [^(]*|gl_wait: [^(]*|gl_post: [^(]*|set-up failed: [^(]*|gl_register_tensor[^:]*|gl_connect[^:]*|gl_register_job|unexplained' \
    "$GL_TMP/soak-errors.txt" | sort | uniq -c | sed 's/^/  /'
fi
if [[ -n ${SOAK_KEEP_LOGS:-} ]]; then
  mkdir -p "$SOAK_KEEP_LOGS/$PHASE" && cp -r "$GL_TMP"/. "$SOAK_KEEP_LOGS/$PHASE/" && echo "logs kept in $SOAK_KEEP_LOGS/$PHASE"
fi
if ((FAILS > 0)); then
  echo "FAIL soak $PHASE: $FAILS problem(s) (PROBLEM lines above)"
  exit 1
fi
echo "PASS soak $PHASE"
