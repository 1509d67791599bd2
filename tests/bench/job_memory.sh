#!/usr/bin/env bash
# tests/bench/job_memory.sh — what a daemon's memory does over many jobs, with no faults:
# three gradlaned in network namespaces (tests/integration/netns.sh), JOBS jobs of three
# gradlane-check ranks (three at a time, the four seed policies in turn, the soak's tensor
# sizes), and every 15 jobs each daemon's RssAnon plus daemon 0's largest anonymous mappings
# (/proc/PID/smaps), so a growth can be told apart: a buffer becoming resident page by page
# (one mapping growing), or the heap (the [heap] and arena mappings).
#
#   tests/bench/job_memory.sh [BUILD_DIR=build] [JOBS=90]          # root; about 2 s a job
#   GL_TRANSPORT=dpdk tests/bench/job_memory.sh build-dpdk 90      # the same over DPDK
#
# A daemon's RssAnon should end where it was once the first jobs had run (docs/daemon.md,
# "Chaos soak"); the chaos soak judges that under faults, this shows the curve.
set -uo pipefail
here=$(cd "$(dirname "$0")/../integration" && pwd)
build=${1:-build}
jobs=${2:-90}
source "$here/netns.sh"
source "$here/common.sh"
it_init "$build/daemon/gradlaned" "$build/tests/integration/gradlane-check"
gl_env_init 3
for i in 0 1 2; do
  gl_daemon_start "$i" --job_retention=2s || it_fail "daemon $i did not start"
done
policies=(fifo p3 bytescheduler prophet)
anon_kb() { awk '/^RssAnon:/ {print $2}' "/proc/$1/status"; }
mappings() {  # the anonymous mappings of PID holding at least 256 kB
  python3 - "$1" <<'PY'
import re, sys
name = size = None
for line in open(f"/proc/{sys.argv[1]}/smaps"):
    m = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)", line)
    if m:
        size = (int(m[2], 16) - int(m[1], 16)) // 1024
        name = m[3].strip() or "[anon]"
    elif line.startswith("Anonymous:") and int(line.split()[1]) >= 256:
        print(f"    {size:6d} kB mapped, {int(line.split()[1]):6d} kB resident {name}")
PY
}
report() {
  echo "after $1: RssAnon $(anon_kb "${GL_DPID[0]}") / $(anon_kb "${GL_DPID[1]}") / $(anon_kb "${GL_DPID[2]}") kB (daemons 0/1/2), load average $(cut -d' ' -f1-3 /proc/loadavg)"
  mappings "${GL_DPID[0]}"
}
for ((j = 0; j < jobs; j += 3)); do
  for k in 0 1 2; do
    it_job_start "mem$((j + k))" "${policies[(j + k) % 4]}" 3 $((j + k)) -- --quiet --sizes=1,1023,50001,300001
  done
  for k in 0 1 2; do
    it_job_wait "mem$((j + k))" 60 >/dev/null 2>&1 || echo "job mem$((j + k)) failed: $GL_TMP/mem$((j + k)).r*.err"
  done
  ((j % 15 == 0)) && report "$((j + 3)) jobs"
done
sleep 3   # ended jobs leave the telemetry after --job_retention
report "$jobs jobs, 3 s after the last"
