#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite: once as a normal build (the
# verbs tests on soft-RoCE in a QEMU guest included: suite 'rxe'), once under AddressSanitizer +
# UndefinedBehaviorSanitizer built with clang (without the several-hundred-MB integration case
# and the guest, which the first pass already runs and which ASan only slows down), and the
# threaded modules' tests (daemon, transport, shm, libclient) under ThreadSanitizer, built with
# clang and its thread-safety analysis (-Werror=thread-safety).
#   deploy/test.sh            all passes
#   deploy/test.sh --quick    the normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
# Each pass says when it started and how loaded the machine was (CI's budget is per run).
T_START=$SECONDS
phase() { echo "== $* (at $((SECONDS - T_START)) s, load average $(cut -d' ' -f1-3 /proc/loadavg))"; }
phase "install what is missing"
bash deploy/install-deps.sh
# The C and C++ sources follow .clang-format (deploy/format.sh fixes them in place).
phase "format check"
bash deploy/format.sh --check

jobs=$(nproc)
run_suite() {  # build_dir, "meson test" extra args (split on spaces), meson setup args...
  local dir=$1 test_args=$2; shift 2
  if [[ -f "$dir/build.ninja" ]]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
  ninja -C "$dir" -j"$jobs"
  # shellcheck disable=SC2086
  meson test -C "$dir" --print-errorlogs --num-processes "$jobs" $test_args
}

# The build outputs that the tests of the given suites run or depend on (ninja target names).
suite_targets() {  # build_dir suite...
  python3 - "$@" <<'PY'
import json, os, subprocess, sys
build, suites = sys.argv[1], set(sys.argv[2:])
def introspect(what):
    return json.loads(subprocess.check_output(["meson", "introspect", build, what]))
files = {t["id"]: t["filename"] for t in introspect("--targets")}
out = set()
for test in introspect("--tests"):
    if any(s.split(":")[-1] in suites for s in test["suite"]):
        for dep in test["depends"]:
            out.update(os.path.relpath(f, build) for f in files.get(dep, []))
print(" ".join(sorted(out)))
PY
}

phase "build + tests (debugoptimized)"
# The chaos soak (10 min) and the Debian package build (suite 'package', ~10 min) run on
# request: docs/daemon.md, docs/operations.md.
# A build directory this script creates gets line tables only (-g1: file:line in backtraces
# and gdb, no variables): g++ compiles this tree about a quarter faster than with full -g
# (engine_test.cc: 18 s against 25 s; the pass's build 312 s against 442 s). One set up
# before (deploy/demo.sh, or by hand) keeps its own flags.
if [[ -f build/build.ninja ]]; then
  run_suite build "--no-suite=soak --no-suite=package"
else
  run_suite build "--no-suite=soak --no-suite=package" -Dc_args=-g1 -Dcpp_args=-g1
fi
if [[ "${1:-}" != "--quick" ]]; then
  # Every parser of untrusted input under libFuzzer for a bounded time (docs/fuzzing.md): a
  # clang build of the parsers only; fails on any crash.
  phase "libFuzzer targets, ${GRADLANE_FUZZ_SECONDS:-15} s each (clang)"
  if [[ ! -f build-fuzz/build.ninja ]]; then
    CC=clang CXX=clang++ meson setup build-fuzz -Dfuzz=enabled -Dtests=disabled -Dbenchmarks=disabled \
      -Ddpdk=disabled -Dverbs=disabled >/dev/null
  fi
  ninja -C build-fuzz -j"$jobs" fuzz
  tests/fuzz/run.sh build-fuzz "${GRADLANE_FUZZ_SECONDS:-15}"
  # Built with clang: it compiles this tree under the sanitizers in under half the time g++ takes
  # (about 260 s against 560 s on 2 cores), and its UBSan also checks float-to-integer overflow.
  phase "build + tests under ASan/UBSan (clang)"
  # A build-sanitize configured with g++ (before this pass moved to clang) cannot switch compilers.
  if [[ -f build-sanitize/build.ninja ]] && ! grep -A1 '^rule cpp_COMPILER$' build-sanitize/build.ninja | grep -q clang; then
    rm -rf build-sanitize
  fi
  export CC=clang CXX=clang++
  # Fewer iterations in the integration scripts that honour IT_ITERATIONS, and two policies in
  # those that honour IT_POLICIES, and the default policy alone in allreduce_exact's fused jobs
  # (the plain pass runs them in full): the sanitizers check the daemon's code paths, which a few
  # iterations of the simplest and of the default policy already take (every policy's own code
  # runs under the sanitizers in the sched unit tests).
  IT_ITERATIONS=15 IT_POLICIES="fifo gradlane" IT_FUSION_POLICIES=gradlane ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-sanitize "--no-suite=integration-big --no-suite=soak --no-suite=package --no-suite=rxe" -Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=disabled -Dtorch=disabled \
      -Doptimization=1  # ASan's recommended level, and quicker to compile than -O2
  unset CC CXX
  # The engine, the session server's acceptor, the admin and metrics threads and the clients
  # share counters, queues and rings: TSan checks the thread rules the comments state. DPDK is
  # left out (its lcore runtime is not instrumented), and so are the integration scripts.
  # Only what those suites run is built (not the simulator, the sched tests or the harnesses).
  # Built with clang, so the same compile also runs clang's thread-safety analysis: data
  # declared ABSL_GUARDED_BY a mutex (daemon/mutex.h) touched without it, or a function
  # declared ABSL_EXCLUSIVE_LOCKS_REQUIRED called without the lock, fails the build.
  phase "build + daemon, transport, shm and libclient tests under ThreadSanitizer (clang, -Wthread-safety)"
  tsan_setup=(-Db_sanitize=thread -Db_lundef=false -Dbenchmarks=disabled -Ddpdk=disabled -Dtorch=disabled -Doptimization=1
              "-Dcpp_args=-Wthread-safety -Werror=thread-safety")
  # A build-tsan configured with g++ (before this pass moved to clang) cannot switch compilers.
  if [[ -f build-tsan/build.ninja ]] && ! grep -A1 '^rule cpp_COMPILER$' build-tsan/build.ninja | grep -q clang; then
    rm -rf build-tsan
  fi
  if [[ -f build-tsan/build.ninja ]]; then
    meson configure build-tsan "${tsan_setup[@]}" >/dev/null
  else
    CC=clang CXX=clang++ meson setup build-tsan "${tsan_setup[@]}" >/dev/null
  fi
  tsan_suites=(daemon transport shm libclient)
  # shellcheck disable=SC2046
  ninja -C build-tsan -j"$jobs" $(suite_targets build-tsan "${tsan_suites[@]}")
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    meson test -C build-tsan --no-rebuild --print-errorlogs --num-processes "$jobs" \
      "${tsan_suites[@]/#/--suite=}"
fi
phase "all passes done"
