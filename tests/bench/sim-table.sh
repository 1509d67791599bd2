#!/usr/bin/env bash
# tests/bench/sim-table.sh — every profile × ρ ∈ {0.5, 1, 2} × bandwidth ∈ {1, 3, 10} Gbit/s ×
# W ∈ {3, 8}, every policy, as ratios to the ideal bound (docs/simulator.md, issue #12).
#
#   tests/bench/sim-table.sh [BUILD_DIR] [PROFILE.json ...] > table.csv
#   tests/bench/sim-table.sh --allreduce [BUILD_DIR] [PROFILE.json ...] > allreduce.csv
#
# --allreduce (docs/simulator.md, "All-reduce mode"): ring all-reduce instead, every profile
# (tiny.json included) at ρ = 1 × bandwidth ∈ {1, 3, 10} Gbit/s × W ∈ {3, 8} × priorities ∈
# {index, pace}: each policy's T / the all-reduce bound, the best policy of the row, the bound
# in ms and gradlane's rules alone (gradlane-rules) / the bound; on stderr, over the index rows,
# per policy the geometric mean of T / bound, the rows where it is best and its worst row, and
# how often gradlane is more than 1% slower than its rules alone.
#
# Defaults: build-h12 (any build dir with sched/gradlane-sim), every tests/data/models/*.json
# but tiny.json. GRADLANE_SIM_JOBS runs that many simulations at once (default 2).
# GRADLANE_SIM_FLAGS adds flags to every simulation (e.g. "--start_skew_us 100": hosts that
# start one after another, as daemons do). Output: one
# CSV row per (profile, rho, bandwidth, W): each policy's T/ideal, the best seed policy,
# gradlane / best seed, the all-ports fluid priority schedule's T/ideal (a reference: what
# a perfect preemptive priority scheduler with no per-message cost gets when every port is
# constrained at once; not a bound, but where it is far above 1 the single-port bound is not
# within reach of priority scheduling), the bound in ms with the daemon's balanced keys
# (the ratios' denominator) and with the plain 4 MiB key map, and gradlane's rules alone
# (gradlane-rules: without the outer loop that picks among candidate schedules) over the bound;
# then, on stderr, the worst rows.
# The simulator is deterministic: the same inputs give the same table on any machine and load.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
allreduce=0
if [[ ${1:-} == --allreduce ]]; then
  allreduce=1
  shift
fi
build=${1:-build-h12}
shift || true
sim="$root/$build/sched/gradlane-sim"
[[ -x $sim ]] || { echo "sim-table: $sim not built (ninja -C $build sched/gradlane-sim)" >&2; exit 2; }
jobs=${GRADLANE_SIM_JOBS:-2}
extra=${GRADLANE_SIM_FLAGS:-}
policies=fifo,p3,bytescheduler,prophet,gradlane,gradlane-rules

if ((allreduce)); then
  (($# > 0)) || set -- "$root"/tests/data/models/*.json
  arrow() {  # profile bandwidth workers priorities
    "$sim" $extra --mode allreduce --profile "$1" --rho 1 --bandwidth "$2" --workers "$3" \
        --priorities "$4" --policy "$policies" --format csv |
      awk -F, -v p="$(basename "$1" .json)" -v bw="$2" -v w="$3" -v pr="$4" '
        NR == 1 { next }
        { r[$1] = $4; ms[$1] = $2 }
        END {
          n = split("fifo p3 bytescheduler prophet gradlane", names, " ")
          best = names[1]
          for (i = 2; i <= n; i++) if (r[names[i]] < r[best]) best = names[i]
          printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", p, bw, w, pr, r["fifo"], r["p3"],
                 r["bytescheduler"], r["prophet"], r["gradlane"], best, ms["ideal"],
                 r["gradlane-rules"]
        }'
  }
  export -f arrow
  export sim policies extra
  rows=$(mktemp)
  trap 'rm -f "$rows"' EXIT
  for p in "$@"; do for bw in 1gbit 3gbit 10gbit; do for w in 3 8; do for pr in index pace; do
    echo "$p $bw $w $pr"
  done; done; done; done | xargs -P "$jobs" -n 4 bash -c 'arrow "$@"' _ |
    sort -t, -k1,1 -k2,2V -k3,3n -k4,4 > "$rows"
  echo "profile,bandwidth,workers,priorities,fifo,p3,bytescheduler,prophet,gradlane,best,ideal_ms,gradlane_rules"
  cat "$rows"
  # The summary is over the index rows only: each (profile, bandwidth, W) once.
  awk -F, '
    $4 != "index" { next }
    { n++; split("fifo p3 bytescheduler prophet gradlane", names, " ")
      for (i = 1; i <= 5; i++) {
        v = $(4 + i); lg[i] += log(v); if (v > worst[i]) { worst[i] = v; wrow[i] = $1 "/" $2 "/W" $3 "/" $4 }
        if (names[i] == $10) wins[i]++ }
      b = 1e9; for (i = 1; i <= 5; i++) if ($(4 + i) < b) b = $(4 + i)
      if (b > bworst) { bworst = b; brow = $0 } if (b <= 1.10) bok++
      lr += log($12); if ($9 > 1.01 * $12) behind++ }
    END {
      printf "# index rows %d; the best policy within 1.10x of the bound in %d; worst best-policy row: %s\n", n, bok, brow > "/dev/stderr"
      for (i = 1; i <= 5; i++)
        printf "# %s: geometric mean %.3f, best in %d rows, worst %.3f (%s)\n", names[i], exp(lg[i] / n), wins[i], worst[i], wrow[i] > "/dev/stderr"
      printf "# gradlane-rules: geometric mean %.3f; gradlane more than 1%% slower than its rules in %d rows\n", exp(lr / n), behind > "/dev/stderr"
    }' "$rows"
  exit 0
fi

if (($# == 0)); then
  set -- $(ls "$root"/tests/data/models/*.json | grep -v '/tiny.json$')
fi

row() {  # profile rho bandwidth workers
  # The bound once more with the plain 4 MiB key map (no balance rule): both bounds are reported.
  local plain
  plain=$("$sim" $extra --profile "$1" --rho "$2" --bandwidth "$3" --workers "$4" --policy fifo \
      --balance_shards=false --format csv | awk -F, '$1 == "ideal" { print $2 }')
  "$sim" $extra --profile "$1" --rho "$2" --bandwidth "$3" --workers "$4" --policy "$policies" \
      --fluid --format csv |
    awk -F, -v p="$(basename "$1" .json)" -v rho="$2" -v bw="$3" -v w="$4" -v plain="$plain" '
      NR == 1 { next }
      { r[$1] = $4; ms[$1] = $2 }
      END {
        best = "fifo"
        split("p3 bytescheduler prophet", seeds, " ")
        for (i in seeds) if (r[seeds[i]] < r[best]) best = seeds[i]
        printf "%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%.3f,%s,%s,%s,%s\n", p, rho, bw, w, r["fifo"],
               r["p3"], r["bytescheduler"], r["prophet"], r["gradlane"], best,
               r["gradlane"] / r[best], r["fluid"], ms["ideal"], plain, r["gradlane-rules"]
      }'
}
export -f row
export sim policies extra

rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for p in "$@"; do for rho in 0.5 1 2; do for bw in 1gbit 3gbit 10gbit; do for w in 3 8; do
  echo "$p $rho $bw $w"
done; done; done; done | xargs -P "$jobs" -n 4 bash -c 'row "$@"' _ |
  sort -t, -k1,1 -k2,2n -k3,3V -k4,4n > "$rows"
echo "profile,rho,bandwidth,workers,fifo,p3,bytescheduler,prophet,gradlane,best_seed,gradlane_vs_best_seed,fluid,ideal_ms,ideal_4mib_keys_ms,gradlane_rules"
cat "$rows"
awk -F, '
  { if ($9 > worst) { worst = $9; wrow = $0 } if ($11 > wseed) { wseed = $11; srow = $0 }
    n++; if ($9 <= 1.10) ok++; if ($11 <= 1.01) okseed++; if ($12 > 1.10) fluidfar++ }
  END { printf "# rows %d; gradlane within 1.10x of the bound: %d; within 1%% of the best seed: %d; fluid reference above 1.10x: %d\n# worst gradlane/bound: %s\n# worst gradlane/best seed: %s\n", n, ok, okseed, fluidfar, wrow, srow > "/dev/stderr" }' "$rows"
