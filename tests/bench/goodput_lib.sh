# tests/bench/goodput_lib.sh — what goodput.sh and dpdk_goodput.sh share: one tensor of
# $bytes bytes reduced by W = 2 daemons (netns.sh hosts 0 and 1, daemons already started) with
# gradlane-replay on a one-layer, zero-compute profile. Sourced after netns.sh, with $bytes,
# $policy, $iters and $replay set ($warmup: iterations run first and not counted, default 2;
# $mode: ps (default) or allreduce; $replay_extra: an array of further gradlane-replay flags).
#
# goodput = S / (time of one reduction, client post to client completion). With W = 2 in
# parameter-server mode each host's link carries, in each direction, 2(W-1)/W x S = S bytes per
# reduction (its pushes to the other shard plus the other shard's results), both directions at
# once, so this is the goodput per direction. The time is the mean over both ranks' $iters
# measured iterations after the warm-up (gradlane-replay's default of 2), shared memory,
# scheduling, aggregation and the return trip included. With zero compute, replay's row k is the
# wait for iteration k-1's results: row 0 is ~0 and row 1 is the job's first reduction, which
# also connects the peers, exchanges manifests and first touches every buffer (30% slower), so
# both are warm-up.
# In all-reduce mode the ring moves the same 2(W-1)/W x S per direction (W = 2: S), so the same
# goodput over the link rate is the fraction of the ring's bandwidth bound 2(W-1)/W · S / B.

# goodput_binaries BUILD_DIR [EXTRA...] : sets GL_DAEMON and replay from the build dir; exits 77
# (skip) naming the first of them, or of the extra programs, that is not built.
goodput_binaries() {
  local bdir=$1 x
  shift
  GL_DAEMON=$bdir/daemon/gradlaned
  replay=$bdir/tests/bench/gradlane-replay
  for x in "$GL_DAEMON" "$replay" "$@"; do
    [[ -x $x ]] || { echo "SKIP: $x not built" >&2; exit 77; }
  done
}

# goodput_profile WHO : writes the one-tensor profile to $GL_TMP/one-tensor.json.
goodput_profile() {
  cat >"$GL_TMP/one-tensor.json" <<JSON
{ "model": "goodput-$bytes", "reference": "one tensor, zero compute: $1",
  "layers": [ {"name": "g", "param_bytes": $bytes, "fwd_us": 0, "bwd_us": 0} ] }
JSON
}

# goodput_reduce TAG : one job through the running daemons; prints "GBIT_PER_S MS_PER_REDUCTION".
goodput_reduce() {
  local tag=$1 r peers
  peers=$(gl_peers)
  for r in 0 1; do
    gl_bg "$r" "replay-$tag.r$r" "$replay" --profile="$GL_TMP/one-tensor.json" \
      --socket="${GL_SOCK[r]}" --job="goodput-$tag" --rank="$r" --world=2 --peers="$peers" \
      --policy="$policy" --mode="${mode:-ps}" --token=goodput --iterations="$iters" --warmup="${warmup:-2}" --timeout_ms=60000 \
      --csv="$GL_TMP/$tag.r$r.csv" --quiet ${replay_extra[@]+"${replay_extra[@]}"}
  done
  for r in 0 1; do
    gl_wait "replay-$tag.r$r" 300 || { gl_show "replay-$tag.r$r"; return 1; }
  done
  cat "$GL_TMP/$tag.r0.csv" "$GL_TMP/$tag.r1.csv" |
    awk -F, -v b="$bytes" '$1 != "iteration" && $4 == 0 { s += $2; n++ }
      END { ms = s / n; printf "%.3f %.1f\n", b * 8 / (ms / 1e3) / 1e9, ms }'
}
