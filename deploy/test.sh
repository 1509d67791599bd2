#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: once as a normal build and
# once under AddressSanitizer + UndefinedBehaviorSanitizer.
#   deploy/test.sh            both passes
#   deploy/test.sh --quick    the normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh

jobs=$(nproc)
run_suite() {  # build_dir, extra meson args...
  local dir=$1; shift
  if [[ -f "$dir/build.ninja" ]]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
  ninja -C "$dir" -j"$jobs"
  meson test -C "$dir" --print-errorlogs --num-processes "$jobs"
}

echo "== build + tests (debugoptimized)"
run_suite build
if [[ "${1:-}" != "--quick" ]]; then
  echo "== build + tests under ASan/UBSan"
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-sanitize -Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=disabled
fi
