#!/usr/bin/env bash
# Installs the Debian packages gradlane needs to build, test and run — only those missing.
# Idempotent and non-interactive; run as root on Debian 12.
#   deploy/install-deps.sh            build + test dependencies
#   deploy/install-deps.sh --profiles also python3-torchvision (only to regenerate
#                                     tests/data/models/*.json; not needed to build or test)
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config git python3
  libabsl-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdpdk-dev dpdk libibverbs-dev librdmacm-dev ibverbs-providers
  prometheus-cpp-dev libsystemd-dev
  iproute2 iperf3 procps
  prometheus systemd
  python3-matplotlib
  python3-torch dataset-fashion-mnist  # gradlane.torch and its training test (torch_exact)
  libtorch-dev pybind11-dev python3-dev  # the c10d backend (libclient/c10d)
  clang libclang-rt-14-dev  # the fuzz step (libclang_rt.fuzzer) and the sanitizer passes
  clang-format  # deploy/format.sh
  dpkg-dev debhelper dh-python lintian  # deploy/package.sh and the 'package' suite (debian/)
  # tests/rxe/rxe-guest.sh (the 'rxe' suite): a QEMU guest with soft-RoCE; perftest's
  # ib_write_bw is the verbs baseline (docs/verbs.md)
  qemu-system-x86 busybox-static ibverbs-utils perftest
)
for arg in "$@"; do
  case $arg in
    --profiles) packages+=(python3-torchvision libopenblas0-openmp) ;;
    *) echo "install-deps: unknown option $arg" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
