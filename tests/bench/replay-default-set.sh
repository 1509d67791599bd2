#!/usr/bin/env bash
# tests/bench/replay-default-set.sh — the replay benchmark's default set (issue #6, docs/design.md §5.1):
# resnet50 and vgg16 at 1, 3 and 10 Gbit/s, W = 3, every policy, through real daemons
# (tests/bench/run-replay), plus each model once unshaped (the daemons' own ceiling, for the
# analysis in docs/benchmarks.md), and resnet50 at the three rates over the DPDK transport where
# gradlaned has it. Writes into DIR:
#   resnet50.csv, vgg16.csv   run-replay's CSV per model (3 bandwidths + unshaped x 4 policies)
#   resnet50-dpdk.csv         the same over DPDK (3 bandwidths x 4 policies)
#   *-iterations.csv          every iteration's time per bandwidth and policy
#   default-set.csv           both, one header
#   default-set.png           measured / ideal per policy and bandwidth, simulator ticks
#   default-set.txt           the tables as printed, the command, the wall time
#   raw-<model>/              run-replay --keep: per run the ranks' CSVs, counters, queue samples
#
#   tests/bench/replay-default-set.sh --out DIR [--build DIR] [--iterations N] [--warmup N]
#                                     [--no-unshaped] [--no-dpdk] [--transport tcp|dpdk]
#                                     [--mode ps|allreduce] [--priorities index|pace|...]
#                                     [--policies LIST]
# (--mode, --priorities and --policies go to run-replay: e.g. the set in all-reduce mode with
# PACE's priorities)
# (default iterations: resnet50 6 measured, vgg16 3, after run-replay's warm-up: 2, or 104 for
# gradlane, whose trials of its candidate schedules they cover; --iterations/--warmup set both
# models)
# Needs root (network namespaces; without them run-replay falls back to unshaped loopback and
# says so). About 9 minutes on the 2-core development VM (docs/benchmarks.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

main() {
  # Iterations per model: vgg16's are 6 s long at 1 Gbit/s, so it gets fewer to stay within the
  # 15 minutes; two warm-ups each (iteration 0 waits for nothing, so iteration 1 carries its
  # traffic too and is longer than the steady state).
  local out="" bdir=$root/build unshaped=1 transport=tcp dpdk=1 mode=ps prio=index policies=all
  local -A iterations=([resnet50]=6 [vgg16]=3) warmup=([resnet50]="" [vgg16]="")
  while (($#)); do
    case $1 in
      --out) out=${2:?--out needs a directory}; shift 2 ;;
      --build) bdir=${2:?--build needs a directory}; shift 2 ;;
      --iterations) iterations=([resnet50]=${2:?} [vgg16]=$2); shift 2 ;;
      --warmup) warmup=([resnet50]=${2:?} [vgg16]=$2); shift 2 ;;
      --transport) transport=${2:?}; shift 2 ;;
      --mode) mode=${2:?}; shift 2 ;;
      --priorities) prio=${2:?}; shift 2 ;;
      --policies) policies=${2:?}; shift 2 ;;
      --no-unshaped) unshaped=0; shift ;;
      --no-dpdk) dpdk=0; shift ;;
      -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; return 0 ;;
      *) echo "replay-default-set: error: unknown option '$1' (see --help)" >&2; return 2 ;;
    esac
  done
  [[ -n $out ]] || { echo "replay-default-set: error: --out DIR is required" >&2; return 2; }
  mkdir -p "$out"
  local bws=1gbit,3gbit,10gbit
  ((unshaped)) && bws+=,unshaped
  local t0=$SECONDS rc=0 model
  {
    echo "# tests/bench/replay-default-set.sh --out $out --build $bdir --transport $transport --mode $mode --priorities $prio --policies $policies$( ((unshaped)) || echo ' --no-unshaped')" \
      "(iterations: resnet50 ${warmup[resnet50]:-default}+${iterations[resnet50]}, vgg16 ${warmup[vgg16]:-default}+${iterations[vgg16]})"
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$root" log -1 --format='commit %h %s' 2>/dev/null | cut -c1-100)"
  } >"$out/default-set.txt"
  for model in resnet50 vgg16; do
    "$root/tests/bench/run-replay" --profile "$root/tests/data/models/$model.json" \
      --bandwidth "$bws" --workers 3 --policies "$policies" --transport "$transport" \
      --mode "$mode" --priorities "$prio" \
      --iterations "${iterations[$model]}" ${warmup[$model]:+--warmup "${warmup[$model]}"} --build "$bdir" \
      --csv "$out/$model.csv" --per-iteration "$out/$model-iterations.csv" --keep "$out/raw-$model" \
      2>&1 | tee -a "$out/default-set.txt" || rc=1
  done
  # resnet50 over DPDK as well, where this gradlaned has the DPDK transport (the same hosts and
  # shaping; net_af_packet on the veths): how much of the TCP rows' loss is the kernel stack.
  local csvs=("$out/resnet50.csv" "$out/vgg16.csv") help
  help=$("$bdir/daemon/gradlaned" --helpfull 2>&1 || true)
  if ((dpdk)) && [[ $transport == tcp && $help == *--dpdk_vdev* ]]; then
    "$root/tests/bench/run-replay" --profile "$root/tests/data/models/resnet50.json" \
      --bandwidth 1gbit,3gbit,10gbit --workers 3 --policies "$policies" --transport dpdk --no-calibrate \
      --mode "$mode" --priorities "$prio" \
      --iterations "${iterations[resnet50]}" ${warmup[resnet50]:+--warmup "${warmup[resnet50]}"} --build "$bdir" \
      --csv "$out/resnet50-dpdk.csv" --per-iteration "$out/resnet50-dpdk-iterations.csv" \
      --keep "$out/raw-resnet50-dpdk" 2>&1 | tee -a "$out/default-set.txt" || rc=1
    csvs+=("$out/resnet50-dpdk.csv")
  elif ((dpdk)); then
    echo "replay-default-set: no DPDK rows: $bdir/daemon/gradlaned has no DPDK transport" | tee -a "$out/default-set.txt"
  fi
  # Combined CSV: one header.
  awk 'FNR > 1 || NR == 1' "${csvs[@]}" >"$out/default-set.csv"
  local wall=$((SECONDS - t0))
  echo "replay-default-set: wall time ${wall} s ($((wall / 60)) min $((wall % 60)) s)" | tee -a "$out/default-set.txt"

  # The plot wants Debian's matplotlib, which a python3 earlier in PATH (pyenv, venv) may lack.
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then
      "$py" "$root/tests/bench/replay_plot.py" "$out/default-set.csv" "$out/default-set.png" &&
        echo "replay-default-set: wrote $out/default-set.png"
      break
    fi
    py=""
  done
  [[ -n $py ]] || echo "replay-default-set: no plot: python3-matplotlib is not installed (deploy/install-deps.sh installs it)" >&2
  echo "replay-default-set: wrote ${csvs[*]} $out/default-set.csv $out/default-set.txt"
  return "$rc"
}

main "$@"; exit  # (one line: bash reads no further, so editing this file mid-run is harmless)
