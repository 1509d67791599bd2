#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a bounded time and fails on any crash.
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET=25] [TARGET...]
# BUILD_DIR: configured with CC=clang CXX=clang++ meson setup BUILD_DIR -Dfuzz=enabled.
# Each target starts from its checked-in seeds (tests/fuzz/corpus/<target>, plus the model
# profiles in tests/data/models and deploy/gradlaned.conf) and writes what it discovers to
# BUILD_DIR/fuzz-corpus/<target> (kept between runs: later runs start further). A crash leaves
# its input in BUILD_DIR/fuzz-artifacts/; copy it into tests/fuzz/corpus/<target>/crash-<what>
# once fixed, with a regression test in tests/unit. Prints per target the executions and the
# coverage libFuzzer reports at the end (cov: edges, ft: features), then one closing line.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR [SECONDS_PER_TARGET] [TARGET...]}
secs=${2:-25}
shift $(( $# >= 2 ? 2 : 1 ))
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(wire reliable session admin_request model_profile dag flags)
fi
build=$(cd "$build" && pwd)
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=()
printf '%-14s %6s %12s %9s %7s %7s %7s  %s\n' TARGET SECONDS EXECUTIONS EXEC/S COV FT CORPUS RESULT
start=$(date +%s)
for t in "${targets[@]}"; do
  exe="$build/tests/fuzz/${t}_fuzz"
  if [[ ! -x $exe ]]; then
    printf '%-14s %s\n' "$t" "missing: $exe (ninja -C $build fuzz)"
    failed+=("$t")
    continue
  fi
  work="$build/fuzz-corpus/$t"
  seeds="$build/fuzz-seeds/$t"
  arts="$build/fuzz-artifacts"
  mkdir -p "$work" "$seeds" "$arts"
  rm -f "$seeds"/*
  case $t in
    model_profile) cp "$root"/tests/data/models/*.json "$seeds"/ ;;
    flags) cp "$root"/deploy/gradlaned.conf "$seeds"/ ;;
  esac
  dirs=("$work" "$seeds")
  [[ -d $here/corpus/$t ]] && dirs+=("$here/corpus/$t")
  log="$build/fuzz-$t.log"
  "$exe" -max_total_time="$secs" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$arts/$t-" "${dirs[@]}" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  if ((rc == 0)); then
    result=ok
  else
    result="CRASH (exit $rc): $log"
    failed+=("$t")
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -5
    ls "$arts" | grep "^$t-" | sed "s|^|  input: $arts/|"
  fi
  printf '%-14s %6s %12s %9s %7s %7s %7s  %s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
elapsed=$(( $(date +%s) - start ))
load=$(cut -d' ' -f1-3 /proc/loadavg)
if ((${#failed[@]} > 0)); then
  echo "fuzz: FAILED: ${failed[*]} (${#targets[@]} targets, ${secs} s each, ${elapsed} s, load ${load})"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${secs} s each without a crash (${elapsed} s, load ${load})"
