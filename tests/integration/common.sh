# tests/integration/common.sh — helpers the integration tests share, on top of netns.sh:
# argument handling and starting/waiting a job of W gradlane-check clients.
#
#   it_init DAEMON CHECK      check the executables exist (else exit 77, "skipped")
#   it_job_start NAME POLICY ITERS SEED [RANKS] -- [CHECK ARGS...]
#                             start one gradlane-check per rank (RANKS: "0 1 2", default all)
#                             in its host, named NAME.r<rank>
#   it_job_wait NAME TIMEOUT_S [RANKS]
#                             wait for every rank; 0 only if all exited 0. TIMEOUT_S bounds the
#                             time without progress (no rank completing anything), not the
#                             job: a busy machine makes a job slower, never a failure
#   it_fail MSG               print the message and exit 1
# Variables: GL_CHECK, IT_TOKEN (the token jobs use), IT_CLIENT_TIMEOUT_MS, IT_CHECK_EXTRA
# (extra gradlane-check flags for every client: --device=cuda puts the tensors in GPU memory;
# for diagnosis, e.g. --linger_ms=500).

IT_TOKEN=""
IT_CLIENT_TIMEOUT_MS=${IT_CLIENT_TIMEOUT_MS:-30000}

it_fail() {
  echo "FAIL: $*" >&2
  exit 1
}

it_init() {
  GL_DAEMON=$1
  GL_CHECK=$2
  if [[ ! -x $GL_DAEMON ]]; then
    echo "SKIP: gradlaned not built ($GL_DAEMON)" >&2
    exit 77
  fi
  [[ -x $GL_CHECK ]] || it_fail "gradlane-check not built ($GL_CHECK)"
  IT_TOKEN="it-token-$$"
}

it_all_ranks() {
  local i out=""
  for ((i = 0; i < GL_W; i++)); do out+="$i "; done
  echo "$out"
}

# it_job_start NAME POLICY ITERS SEED [RANKS] -- [CHECK ARGS...]
it_job_start() {
  local name=$1 policy=$2 iters=$3 seed=$4
  shift 4
  local ranks
  ranks=$(it_all_ranks)
  if [[ ${1:-} != -- && $# -gt 0 ]]; then ranks=$1; shift; fi
  [[ ${1:-} == -- ]] && shift
  local peers r
  peers=$(gl_peers)
  for r in $ranks; do
    gl_bg "$r" "$name.r$r" "$GL_CHECK" --socket="${GL_SOCK[r]}" --job="$name" --rank="$r" \
      --world="$GL_W" --peers="$peers" --policy="$policy" --token="$IT_TOKEN" \
      --iterations="$iters" --seed="$seed" --timeout_ms="$IT_CLIENT_TIMEOUT_MS" \
      --progress_file="$GL_TMP/$name.r$r.progress" "$@" \
      ${IT_CHECK_EXTRA:-}
  done
}

# it_job_wait NAME TIMEOUT_S [RANKS]
it_job_wait() {
  local name=$1 timeout=$2 ranks=${3:-$(it_all_ranks)} r rc bad=0 deadline seen="" now running
  # Every rank's client rewrites its progress file as completions arrive; the deadline moves
  # with it. Clients bound their own waits too, so this only catches a client stuck elsewhere.
  deadline=$((SECONDS + timeout))
  while :; do
    running=0
    for r in $ranks; do
      [[ -n ${GL_PID[$name.r$r]:-} ]] && kill -0 "${GL_PID[$name.r$r]}" 2>/dev/null && running=1
    done
    ((running)) || break
    now=""
    for r in $ranks; do now+=$(cat "$GL_TMP/$name.r$r.progress" 2>/dev/null || true); now+="|"; done
    if [[ $now != "$seen" ]]; then
      seen=$now
      deadline=$((SECONDS + timeout))
    fi
    ((SECONDS >= deadline)) && break
    sleep 0.1
  done
  for r in $ranks; do
    rc=0
    gl_wait "$name.r$r" 1 || rc=$?
    if ((rc != 0)); then
      echo "job $name rank $r: exit $rc$( ((rc == 124)) && echo " (no progress for ${timeout}s: killed)")" >&2
      gl_show "$name.r$r" 8
      bad=1
    else
      tail -n 1 "$GL_TMP/$name.r$r.out" >&2
    fi
  done
  return "$bad"
}
