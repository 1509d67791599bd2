#!/usr/bin/env bash
# Line and branch coverage of the parsers under fuzz, reached by a corpus (docs/fuzzing.md):
# replays every target's corpus in a build with clang's source-based coverage and reports the
# files each target exists for.
#   CC=clang CXX=clang++ meson setup build-fuzz-cov -Dfuzz=enabled -Dtests=disabled \
#     -Dbenchmarks=disabled -Ddpdk=disabled -Dverbs=disabled \
#     "-Dcpp_args=-fprofile-instr-generate -fcoverage-mapping" \
#     "-Dcpp_link_args=-fprofile-instr-generate" && ninja -C build-fuzz-cov fuzz
#   tests/fuzz/coverage.sh build-fuzz-cov build-fuzz     # corpora of build-fuzz's runs + seeds
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cov=$(cd "${1:?usage: coverage.sh COVERAGE_BUILD_DIR [FUZZ_BUILD_DIR]}" && pwd)
runs=${2:-}
[[ -n $runs ]] && runs=$(cd "$runs" && pwd)
declare -A files=(
  [wire]="transport/wire.cc"
  [reliable]="transport/datagram/datagram_transport.cc transport/datagram/send_window.cc transport/datagram/reorder_buffer.cc transport/common/hello.cc transport/common/region_table.cc"
  [session]="daemon/session.cc daemon/session_hello.cc"
  [admin_request]="daemon/admin_request.cc"
  [model_profile]="sched/model_profile.cc"
  [dag]="sched/dag.cc"
  [flags]="daemon/config.cc"
)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
printf '%-14s %-40s %8s %9s %9s\n' TARGET FILE INPUTS LINES BRANCHES
for t in wire reliable session admin_request model_profile dag flags; do
  exe="$cov/tests/fuzz/${t}_fuzz"
  dirs=()
  [[ -d $here/corpus/$t ]] && dirs+=("$here/corpus/$t")
  [[ -n $runs && -d $runs/fuzz-corpus/$t ]] && dirs+=("$runs/fuzz-corpus/$t")
  [[ $t == model_profile ]] && dirs+=("$root/tests/data/models")
  n=$(find "${dirs[@]}" -type f | wc -l)
  LLVM_PROFILE_FILE="$out/$t.profraw" "$exe" -runs=0 "${dirs[@]}" >/dev/null 2>&1
  llvm-profdata merge -sparse "$out/$t.profraw" -o "$out/$t.profdata"
  (cd "$cov" && llvm-cov report "$exe" -instr-profile="$out/$t.profdata") >"$out/$t.txt" 2>/dev/null
  for f in ${files[$t]}; do
    # FILE regions missed cover functions missed executed lines missed cover branches missed cover
    read -r -a c <<<"$(grep -E "^(\.\./)*$f " "$out/$t.txt" | head -1)"
    printf '%-14s %-40s %8s %9s %9s\n' "$t" "$f" "$n" "${c[9]}" "${c[12]}"
  done
done
