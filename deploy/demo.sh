#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job.
# Three emulated hosts on this machine (network namespaces joined by a bridge, each link shaped
# with tc tbf to $DEMO_RATE; plain loopback where namespaces cannot be created), one gradlaned
# per host, and per host a gradlane-replay that emulates training of resnet50 (compute emulated
# by sleeping, gradients through the real daemons): with fifo (no scheduling), bytescheduler
# (the strongest of the papers' schedules here) and gradlane (the daemon's default: it times
# its candidate schedules in its first 104 iterations and keeps the fastest). Every policy
# gets those 104 warm-up iterations, so all are measured equally far into their runs (about
# 3 minutes in all). Prints the measured iterations side by side with the simulator's
# prediction.
# The harness is tests/bench/run-replay (docs/benchmarks.md); this script only builds and
# formats its output.
#   deploy/demo.sh                          resnet50 at 3gbit
#   DEMO_PROFILE=tests/data/models/resnet50-stepwise.json DEMO_RATE=5gbit deploy/demo.sh
#   DEMO_POLICIES="fifo p3 bytescheduler prophet" DEMO_ITERATIONS=10 deploy/demo.sh
#   DEMO_WARMUP=2 deploy/demo.sh      a shorter run (gradlane is then measured in its trials)
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
if [[ ! -f build/build.ninja ]]; then meson setup build >/dev/null; fi

profile=${DEMO_PROFILE:-tests/data/models/resnet50.json}
rate=${DEMO_RATE:-3gbit}
read -r -a policies <<<"${DEMO_POLICIES:-fifo bytescheduler gradlane}"
iterations=${DEMO_ITERATIONS:-8}
warmup=${DEMO_WARMUP:-104}
bdir=${DEMO_BUILD:-build}  # the build dir (the one built above unless DEMO_BUILD says otherwise)

ninja -C "$bdir" -j"$(nproc)" sched/gradlane-sim daemon/gradlaned tests/bench/gradlane-replay

out=$(mktemp -d /tmp/gradlane-demo.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "demo: 3 hosts, $rate each way; replaying $profile: $iterations measured iterations per" \
  "policy (${policies[*]}) after $warmup warm-up"
rc=0
tests/bench/run-replay --profile "$profile" --bandwidth "$rate" --workers 3 \
  --policies "$(IFS=,; echo "${policies[*]}")" --iterations "$iterations" --warmup "$warmup" \
  --build "$bdir" --csv "$out/demo.csv" --per-iteration "$out/iterations.csv" --quiet || rc=$?
if [[ ! -s $out/demo.csv ]] || ((rc != 0 && rc != 1)); then
  echo "demo: the replay failed (exit $rc)" >&2
  exit 1
fi

# Measured iteration times (every rank lined up as the simulator does), one column per policy;
# row i is each policy's i-th iteration after its own warm-up.
w=16  # column width: the longest header and two spaces
for p in "${policies[@]}"; do ((${#p} + 7 > w)) && w=$((${#p} + 7)); done
echo
printf "%-10s" "measured"
for p in "${policies[@]}"; do printf "%${w}s" "$p (ms)"; done
echo
for ((i = 0; i < iterations; i++)); do
  printf "%-10s" "$i"
  for p in "${policies[@]}"; do
    printf "%${w}s" "$(awk -F, -v p="$p" -v i="$i" '$2 == p && $5 == 0 && n++ == i { printf "%.1f", $4 }' "$out/iterations.csv")"
  done
  echo
done
col() {  # col POLICY COLUMN [FORMAT]
  awk -F, -v p="$1" -v c="$2" -v f="${3:-%.1f}" 'NR == 1 { for (i = 1; i <= NF; i++) n[$i] = i; next }
    $1 == p && $n[c] != "" { printf f, $n[c] }' "$out/demo.csv"
}
for row in "mean:iteration_ms" "simulated:sim_iteration_ms"; do
  printf "%-10s" "${row%%:*}"
  for p in "${policies[@]}"; do printf "%${w}s" "$(col "$p" "${row#*:}")"; done
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
