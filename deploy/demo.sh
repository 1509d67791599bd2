#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job.
# Three emulated hosts on this machine (network namespaces joined by a bridge, each link shaped
# with tc tbf to $DEMO_RATE; plain loopback where namespaces cannot be created), one gradlaned
# per host, and per host a gradlane-replay that emulates training of resnet50 (compute emulated
# by sleeping, gradients through the real daemons): first with fifo, then with prophet. Prints
# the iteration times side by side with the simulator's prediction for the same setting.
# The harness is tests/bench/run-replay (docs/benchmarks.md); this script only builds and
# formats its output.
#   deploy/demo.sh                          resnet50 at 3gbit
#   DEMO_PROFILE=tests/data/models/resnet50-stepwise.json DEMO_RATE=5gbit deploy/demo.sh
#   DEMO_POLICIES="fifo p3 bytescheduler prophet" DEMO_ITERATIONS=10 deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
if [[ ! -f build/build.ninja ]]; then meson setup build >/dev/null; fi

profile=${DEMO_PROFILE:-tests/data/models/resnet50.json}
rate=${DEMO_RATE:-3gbit}
read -r -a policies <<<"${DEMO_POLICIES:-fifo prophet}"
iterations=${DEMO_ITERATIONS:-8}
warmup=${DEMO_WARMUP:-2}
bdir=${DEMO_BUILD:-build}  # the build dir (the one built above unless DEMO_BUILD says otherwise)

ninja -C "$bdir" -j"$(nproc)" sched/gradlane-sim daemon/gradlaned tests/bench/gradlane-replay

out=$(mktemp -d /tmp/gradlane-demo.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "demo: 3 hosts, $rate each way; replaying $profile: $iterations iterations after $warmup warm-up, per policy (${policies[*]})"
rc=0
tests/bench/run-replay --profile "$profile" --bandwidth "$rate" --workers 3 \
  --policies "$(IFS=,; echo "${policies[*]}")" --iterations "$iterations" --warmup "$warmup" \
  --build "$bdir" --csv "$out/demo.csv" --per-iteration "$out/iterations.csv" --quiet || rc=$?
if [[ ! -s $out/demo.csv ]] || ((rc != 0 && rc != 1)); then
  echo "demo: the replay failed (exit $rc)" >&2
  exit 1
fi

# Iteration times (every rank lined up as the simulator does), one column per policy.
echo
printf "%-10s" "iteration"
for p in "${policies[@]}"; do printf "%16s" "$p (ms)"; done
echo
for ((k = warmup; k < warmup + iterations; k++)); do
  printf "%-10s" "$k"
  for p in "${policies[@]}"; do
    printf "%16s" "$(awk -F, -v p="$p" -v k="$k" '$2 == p && $3 == k { printf "%.1f", $4 }' "$out/iterations.csv")"
  done
  echo
done
col() {  # col POLICY COLUMN [FORMAT]
  awk -F, -v p="$1" -v c="$2" -v f="${3:-%.1f}" 'NR == 1 { for (i = 1; i <= NF; i++) n[$i] = i; next }
    $1 == p && $n[c] != "" { printf f, $n[c] }' "$out/demo.csv"
}
for row in "mean:iteration_ms" "simulated:sim_iteration_ms"; do
  printf "%-10s" "${row%%:*}"
  for p in "${policies[@]}"; do printf "%16s" "$(col "$p" "${row#*:}")"; done
  echo
done
base=${policies[0]}
for p in "${policies[@]:1}"; do
  awk -F, -v p="$p" -v q="$base" 'NR == 1 { for (i = 1; i <= NF; i++) n[$i] = i; next }
    { t[$1] = $n["iteration_ms"]; s[$1] = $n["sim_iteration_ms"] }
    END { if (t[p] > 0) printf "speedup of %s over %s: %.3fx measured, %.3fx simulated\n", p, q, t[q] / t[p], s[q] / s[p] }' "$out/demo.csv"
done
network=$(col "$base" network %s)
ideal=$(col "$base" ideal_ms)
wire=$(col "$base" wire_gbit %.2f)
echo "simulator's ideal bound (lower bound on any schedule, docs/simulator.md) at $rate: ${ideal:-?} ms;" \
  "compute alone: $(col "$base" compute_ms) ms"
[[ -n $wire ]] && echo "the emulated network delivered $wire Gbit/s per port to iperf3 (all hosts to all) just before" \
  "(this machine's CPU is shared by every emulated host)"
[[ $network == loopback ]] && echo "note: loopback is not shaped, so times are not comparable with the simulation at $rate"
echo "(all policies and columns: tests/bench/run-replay --help; the default set: tests/bench/replay-default-set.sh)"
exit "$rc"
