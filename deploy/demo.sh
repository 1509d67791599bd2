#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job.
# Until gradlaned lands this is the simulator comparing every policy on resnet50 at 3 Gbit/s
# with three workers (co-located parameter servers).
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
if [[ ! -f build/build.ninja ]]; then meson setup build >/dev/null; fi
ninja -C build -j"$(nproc)" gradlane-sim
./build/sched/gradlane-sim --profile tests/data/models/resnet50.json --bandwidth 3gbit \
  --workers 3 --policy all --format table "$@"
