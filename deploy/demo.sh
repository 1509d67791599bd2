#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job.
# Three emulated hosts on this machine (network namespaces joined by a bridge, each link shaped
# with tc tbf to $DEMO_RATE; plain loopback where namespaces cannot be created), one gradlaned
# per host, and per host a gradlane-replay that emulates training of resnet50 (compute emulated
# by sleeping, gradients through the real daemons): first with fifo, then with prophet. Prints
# the iteration times side by side with the simulator's prediction for the same setting.
#   deploy/demo.sh                          resnet50 at 3gbit
#   DEMO_PROFILE=tests/data/models/resnet50-stepwise.json DEMO_RATE=5gbit deploy/demo.sh
#   DEMO_POLICIES="fifo p3 bytescheduler prophet" DEMO_ITERATIONS=10 deploy/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
if [[ ! -f build/build.ninja ]]; then meson setup build >/dev/null; fi

profile=${DEMO_PROFILE:-tests/data/models/resnet50.json}
rate=${DEMO_RATE:-3gbit}
policies=(${DEMO_POLICIES:-fifo prophet})
iterations=${DEMO_ITERATIONS:-8}
warmup=${DEMO_WARMUP:-2}
W=3
bdir=${DEMO_BUILD:-build}  # the build dir (the one built above unless DEMO_BUILD says otherwise)
sim=$bdir/sched/gradlane-sim
daemon=$bdir/daemon/gradlaned
replay=$bdir/tests/bench/gradlane-replay

ninja -C "$bdir" -j"$(nproc)" sched/gradlane-sim daemon/gradlaned tests/bench/gradlane-replay

source tests/integration/netns.sh
GL_DAEMON=$daemon
GL_READY_TIMEOUT=20
gl_env_init "$W" "$rate"
shaped=$rate
[[ $GL_MODE == loopback ]] && shaped="unshaped loopback"
for ((i = 0; i < W; i++)); do gl_daemon_start "$i" --peer_timeout=10s --reduce=mean; done
peers=$(gl_peers)
echo "demo: $W hosts ($GL_MODE, $shaped), daemons at $peers"
echo "demo: replaying $profile: $iterations iterations after $warmup warm-up, per policy"

for policy in "${policies[@]}"; do
  for ((r = 0; r < W; r++)); do
    gl_bg "$r" "replay-$policy.r$r" "$replay" --profile="$profile" --socket="${GL_SOCK[r]}" \
      --job="demo-$policy" --rank="$r" --world="$W" --peers="$peers" --policy="$policy" \
      --token="demo" --iterations="$iterations" --warmup="$warmup" \
      --csv="$GL_TMP/$policy.r$r.csv" --quiet
  done
  for ((r = 0; r < W; r++)); do
    rc=0
    gl_wait "replay-$policy.r$r" 300 || rc=$?
    if ((rc != 0)); then
      gl_show "replay-$policy.r$r"
      echo "demo: replay rank $r with $policy failed (exit $rc)" >&2
      exit 1
    fi
  done
  echo "  $policy: $(tail -n 1 "$GL_TMP/replay-$policy.r0.out" | sed 's/^gradlane-replay: //')"
done

# Iteration times of rank 0 (every rank sees the same ones up to scheduling noise), side by side.
echo
printf "%-10s" "iteration"
for policy in "${policies[@]}"; do printf "%14s" "$policy (ms)"; done
echo
for ((k = warmup; k < warmup + iterations; k++)); do
  printf "%-10s" "$k"
  for policy in "${policies[@]}"; do
    printf "%14s" "$(awk -F, -v k="$k" '$1 == k { print $2 }' "$GL_TMP/$policy.r0.csv")"
  done
  echo
done
printf "%-10s" "mean"
declare -A mean
for policy in "${policies[@]}"; do
  mean[$policy]=$(awk -F, 'NR > 1 && $4 == 0 { s += $2; n++ } END { printf "%.1f", s / n }' \
    "$GL_TMP/$policy.r0.csv")
  printf "%14s" "${mean[$policy]}"
done
echo
printf "%-10s" "simulated"
simcsv=$("$sim" --profile "$profile" --bandwidth "$rate" --workers "$W" \
  --policy "$(IFS=,; echo "${policies[*]}")" --format csv 2>/dev/null || true)
for policy in "${policies[@]}"; do
  printf "%14s" "$(awk -F, -v p="$policy" '$1 == p { printf "%.1f", $2 }' <<<"$simcsv")"
done
echo
ideal=$(awk -F, '$1 == "ideal" { printf "%.1f", $2 }' <<<"$simcsv")
base=${policies[0]}
for policy in "${policies[@]:1}"; do
  awk -v a="${mean[$base]}" -v b="${mean[$policy]}" -v p="$policy" -v q="$base" \
    'BEGIN { printf "speedup of %s over %s: %.3fx (measured)\n", p, q, a / b }'
done
echo "simulator's ideal bound (lower bound on any schedule, docs/simulator.md) at $rate: ${ideal:-?} ms;" \
  "compute alone: $(grep -o 'compute alone [0-9.]* ms' "$GL_TMP/replay-$base.r0.out" | head -1 | cut -d' ' -f3) ms"
[[ $GL_MODE == loopback ]] && echo "note: loopback is not shaped, so times are not comparable with the simulation at $rate"
for ((i = 0; i < W; i++)); do gl_daemon_stop "$i" || true; done
