#!/usr/bin/env bash
# tests/rxe/rxe-guest.sh — runs one command inside a throwaway QEMU guest (software emulation,
# no KVM needed) whose kernel has soft-RoCE (rdma_rxe) on loopback, so verbs code can be tested
# against the real kernel verbs path (ib_core/ib_uverbs/rdma_rxe, /dev/infiniband/uverbs0) on a
# machine without an RDMA NIC and without loading rdma_rxe into the host kernel.
#
#   tests/rxe/rxe-guest.sh [OPTIONS] -- COMMAND [ARGS...]
#   tests/rxe/rxe-guest.sh [OPTIONS] --selftest      build tests/rxe/rxe_selftest.c and run it
#
#   --workdir DIR   cache + scratch (default: build-rxe/ in the repository root, git-ignored)
#   --timeout SEC   give up after SEC seconds in all (kernel fetch, boot, command; default 300):
#                   QEMU is killed and the script exits 124
#   --env NAME=VALUE  set in the command's environment (which is otherwise only PATH and HOME)
#   --mode virtfs|copy
#                   virtfs (default where QEMU supports -virtfs): the host's / is shared read-only
#                     over 9p and the guest chroots into it, under a tmpfs overlay (writable,
#                     writes vanish with the guest) — COMMAND, its libraries, its input files and
#                     the current directory are the host's, so anything runnable here runs there.
#                   copy: COMMAND (an executable), the setup tools and every library ldd lists
#                     for them are copied into the initramfs; nothing else from the host exists.
#   --copy PATH     (copy mode) also copy PATH (an executable: with its libraries); repeatable
#   --smp N         guest CPUs (default 1; under TCG each is a host thread)
#   --mem MIB       guest memory (default 1024)
#   --accel A       QEMU accelerator (default tcg; kvm works where /dev/kvm is usable)
#
# The guest: Debian's stock kernel (linux-image-amd64, fetched with `apt-get download` into
# DIR/cache and unpacked there with dpkg-deb, never installed on the host; reused until
# DIR/cache is removed), an initramfs with busybox-static as /init's shell and the modules
# rdma_rxe needs (dependency order from modules.dep, made with busybox depmod); it brings lo
# up, runs `rdma link add rxe0 type rxe netdev lo`, checks ibv_devices lists rxe0, then runs
# COMMAND in the host's current directory, stdin /dev/null. The console (serial) is printed; exits
# with COMMAND's exit status (the guest prints RXE_EXIT=<code>), 1 if the guest setup failed,
# 124 on timeout, 77 (skip) when a requirement below is missing.
#
# Requirements (Debian 12): qemu-system-x86 busybox-static iproute2 ibverbs-utils
# ibverbs-providers, apt access to fetch linux-image-amd64 on the first run (about 70 MB);
# --selftest also gcc and libibverbs-dev (deploy/install-deps.sh --rxe installs them all).
# Under TCG a boot takes about 5 s and the guest is slow (ib_write_bw: ~50 MB/s), so keep guest
# commands short; the kernel cache (DIR/cache) is about 400 MB, the initramfs 2-3 MB.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
workdir=$root/build-rxe
timeout_s=300
mode=auto
smp=1
mem=1024
accel=tcg
selftest=0
extra_copies=()
guest_env=()

die() { echo "rxe-guest: $*" >&2; exit 1; }
skip() { echo "rxe-guest: SKIP: $*" >&2; exit 77; }

while (($#)); do
  case $1 in
    --workdir) workdir=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --copy) extra_copies+=("$2"); shift 2 ;;
    --env) [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env wants NAME=VALUE"; guest_env+=("$2"); shift 2 ;;
    --smp) smp=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --accel) accel=$2; shift 2 ;;
    --selftest) selftest=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ $timeout_s =~ ^[0-9]+$ ]] || die "--timeout wants seconds, got '$timeout_s'"
if ((selftest)); then
  (($# == 0)) || die "--selftest takes no command"
else
  (($# > 0)) || die "no command (usage: $0 [OPTIONS] -- COMMAND [ARGS...]; see --help)"
fi

# ---- requirements: say what to install, exit 77 -------------------------------------------
missing=()
need_pkg() {  # PACKAGE TEST...
  local pkg=$1; shift
  "$@" >/dev/null 2>&1 || missing+=("$pkg")
}
need_pkg qemu-system-x86 command -v qemu-system-x86_64
need_pkg busybox-static test -x /bin/busybox -a "$(dpkg-query -W -f='${Status}' busybox-static 2>/dev/null)" = "install ok installed"
need_pkg iproute2 command -v rdma
need_pkg ibverbs-utils command -v ibv_devices
need_pkg ibverbs-providers test -f /etc/libibverbs.d/rxe.driver
need_pkg dpkg command -v dpkg-deb
if ((selftest)); then
  need_pkg gcc command -v gcc
  need_pkg libibverbs-dev test -f /usr/include/infiniband/verbs.h
fi
if ((${#missing[@]})); then
  skip "missing packages; install them with: apt-get install --no-install-recommends ${missing[*]}"
fi
shopt -s nullglob
providers=(/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
shopt -u nullglob
((${#providers[@]})) || skip "no rxe provider (librxe-rdmav*.so); apt-get install ibverbs-providers"

if [[ $mode == auto ]]; then
  if qemu-system-x86_64 -help 2>/dev/null | grep -q -- '^-virtfs' &&
     qemu-system-x86_64 -device help 2>/dev/null | grep -q virtio-9p-pci; then
    mode=virtfs
  else
    mode=copy
  fi
fi
[[ $mode == virtfs || $mode == copy ]] || die "--mode is virtfs or copy, got '$mode'"

mkdir -p "$workdir"
workdir=$(cd "$workdir" && pwd)
cache=$workdir/cache

# ---- the self-test: built here, run in the guest -------------------------------------------
if ((selftest)); then
  gcc -O2 -g -Wall -Wextra -o "$workdir/rxe_selftest" "$root/tests/rxe/rxe_selftest.c" -libverbs
  set -- "$workdir/rxe_selftest"
fi

# ---- kernel: apt-get download + dpkg-deb -x, once ------------------------------------------
# Several guests may start at once (meson runs the rxe tests in parallel): one fetches the
# kernel while the others wait for it, and each builds its own initramfs and console log below.
exec {cache_lock}>"$workdir/cache.lock"
flock "$cache_lock"
if [[ ! -f $cache/kernel.ready ]]; then
  rm -rf "$cache/debs"; mkdir -p "$cache/debs"
  echo "rxe-guest: fetching linux-image-amd64 into $cache (once)"
  # apt-get download as root warns that _apt cannot write the directory; it still works.
  (cd "$cache/debs" && timeout "$timeout_s" apt-get download -q linux-image-amd64 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
    skip "apt-get download linux-image-amd64 failed (no apt access?); the kernel cache $cache is empty"
  debs=("$cache"/debs/linux-image-amd64_*.deb); meta=${debs[0]}
  image=$(dpkg-deb -f "$meta" Depends | tr ',' '\n' | sed -n 's/^ *\(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)
  [[ -n $image ]] || die "cannot tell the kernel package from $(basename "$meta")'s Depends"
  (cd "$cache/debs" && timeout "$timeout_s" apt-get download -q "$image" 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
    skip "apt-get download $image failed"
  rm -rf "$cache/kernel"
  debs=("$cache"/debs/"${image}"_*.deb)
  dpkg-deb -x "${debs[0]}" "$cache/kernel"
  kver=${image#linux-image-}
  # The package has no modules.dep (its postinst runs depmod); busybox's depmod makes one.
  busybox depmod -b "$cache/kernel" "$kver"
  rm -f "$cache"/debs/*.deb   # the unpacked tree is what is reused
  echo "$kver" >"$cache/kernel.ready"
fi
flock -u "$cache_lock"
kver=$(cat "$cache/kernel.ready")
kroot=$cache/kernel
vmlinuz=$kroot/boot/vmlinuz-$kver
moddir=$kroot/lib/modules/$kver
[[ -f $vmlinuz && -f $moddir/modules.dep ]] || die "kernel cache $cache is incomplete; remove it and rerun"

# ---- initramfs -----------------------------------------------------------------------------
# Modules, dependencies first. crc32_generic is no modules.dep dependency of rdma_rxe (it asks
# the crypto API for "crc32" at run time, for the ICRC), so it is named explicitly.
wanted=(crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe)
if [[ $mode == virtfs ]]; then
  wanted+=(virtio_pci 9pnet_virtio 9p overlay)
fi
declare -A modpath=() moddeps=() seen=()
while IFS=: read -r path deps; do
  name=${path##*/}; name=${name%%.ko*}; modpath[${name//-/_}]=$path; moddeps[${name//-/_}]=$deps
done <"$moddir/modules.dep"
ordered=()
add_module() {
  local name=${1//-/_} path dep
  [[ -n ${seen[$name]:-} ]] && return
  seen[$name]=1
  path=${modpath[$name]:-}
  if [[ -z $path ]]; then
    # built into this kernel: nothing to load
    grep -q "/${name//_/[-_]}\.ko" "$moddir/modules.builtin" && return
    die "module $name is neither in $moddir/modules.dep nor built in"
  fi
  for dep in ${moddeps[$name]}; do
    dep=${dep##*/}; add_module "${dep%%.ko*}"
  done
  ordered+=("$path")
}
for m in "${wanted[@]}"; do add_module "$m"; done

stage=$workdir/initramfs.$$
initrd=$workdir/initramfs.$$.cpio.gz
trap 'rm -rf "$stage" "$initrd"' EXIT
rm -rf "$stage"
mkdir -p "$stage"/{bin,dev,proc,sys,run,tmp,modules,lower,rw,newroot,rxe}
cp /bin/busybox "$stage/bin/busybox"
for a in sh mount mkdir insmod poweroff chroot ip cat cut cp grep ln sleep; do
  ln -s busybox "$stage/bin/$a"
done
: >"$stage/modules.list"
for path in "${ordered[@]}"; do
  ko=$(basename "$path")
  case $ko in
    *.ko.xz) xz -dc "$moddir/$path" >"$stage/modules/${ko%.xz}"; ko=${ko%.xz} ;;
    *.ko.zst) zstd -qdc "$moddir/$path" >"$stage/modules/${ko%.zst}"; ko=${ko%.zst} ;;
    *) cp "$moddir/$path" "$stage/modules/$ko" ;;
  esac
  echo "$ko" >>"$stage/modules.list"
done

# copy mode: FILE and the libraries ldd lists for it, at the same paths.
copy_with_libs() {
  local f=$1 lib
  [[ -e $stage$f ]] && return
  mkdir -p "$stage$(dirname "$f")"
  cp -L "$f" "$stage$f"
  for lib in $(ldd "$f" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\) .*/\1/p; s/^[[:space:]]*\(\/[^ ]*\) (.*/\1/p'); do
    copy_with_libs "$lib"
  done
}
if [[ $mode == copy ]]; then
  for tool in rdma ibv_devices ibv_devinfo; do copy_with_libs "$(command -v "$tool")"; done
  for p in "${providers[@]}"; do copy_with_libs "$p"; done
  mkdir -p "$stage/etc/libibverbs.d"
  cp /etc/libibverbs.d/rxe.driver "$stage/etc/libibverbs.d/"
  for x in "${extra_copies[@]}"; do
    x=$(command -v "$x") || die "--copy: '$x' not found"; copy_with_libs "$x"
  done
  cmd=$(command -v "$1") || die "copy mode: '$1' is not an executable here"
  [[ $cmd == */* ]] || die "copy mode: '$1' is a shell builtin or function; run it with sh -c"
  cmd=$(readlink -f "$cmd")
  copy_with_libs "$cmd"
  shift; set -- "$cmd" "$@"   # the guest has no PATH lookup or current directory of the host
fi

# POSIX single-quoting, for the guest's /bin/sh (dash in virtfs mode, busybox in copy mode).
q() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }
{
  echo 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; export PATH'
  echo 'HOME=/root; export HOME'
  echo 'ip link set lo up || exit 1'
  echo 'rdma link add rxe0 type rxe netdev lo || exit 1'
  echo 'ibv_devices'
  echo 'ibv_devices | grep -qw rxe0 || { echo "rxe-guest: ibv_devices does not list rxe0"; exit 1; }'
} >"$stage/rxe/setup.sh"
{
  echo 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; export PATH'
  echo 'HOME=/root; export HOME'
  for e in "${guest_env[@]}"; do echo "export ${e%%=*}=$(q "${e#*=}")"; done
  if [[ $mode == virtfs ]]; then echo "cd $(q "$PWD") 2>/dev/null || cd /"; else echo 'cd /'; fi
  printf 'exec'; for a in "$@"; do printf ' %s' "$(q "$a")"; done; echo ' </dev/null'
} >"$stage/rxe/cmd.sh"
echo "$mode" >"$stage/rxe/mode"

cat >"$stage/init" <<'EOF'
#!/bin/busybox sh
# rxe-guest's /init: modules, root filesystem, rxe0, the command, RXE_EXIT=<code>, power off.
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev
fail() { echo "rxe-guest(guest): $*"; echo "RXE_SETUP_FAILED"; poweroff -f; sleep 5; }
echo "rxe-guest(guest): $(cat /proc/uptime | cut -d' ' -f1)s after boot; loading modules"
for m in $(cat /modules.list); do insmod /modules/$m || fail "insmod $m"; done
mode=$(cat /rxe/mode)
if [ "$mode" = virtfs ]; then
  mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower ||
    fail "mounting the host's / (9p)"
  mount -t tmpfs -o mode=0755 tmpfs /rw; mkdir -p /rw/upper /rw/work
  if ! mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot; then
    echo "rxe-guest(guest): no overlay on 9p; the host's / stays read-only (tmpfs on /tmp, /run)"
    mount --bind /lower /newroot; mount -t tmpfs tmpfs /newroot/tmp
  fi
  new=/newroot
  mount -t proc proc $new/proc; mount -t sysfs sysfs $new/sys; mount -t devtmpfs devtmpfs $new/dev
  mount -t tmpfs -o mode=0755 tmpfs $new/run
  mkdir -p $new/dev/shm $new/dev/pts; mount -t tmpfs tmpfs $new/dev/shm; mount -t devpts devpts $new/dev/pts
  mkdir -p $new/run/rxe; cp /rxe/setup.sh /rxe/cmd.sh $new/run/rxe/
  run() { chroot $new /bin/sh "/run/rxe/$1"; }
else
  ln -s /proc/self/fd /dev/fd 2>/dev/null
  run() { /bin/sh "/rxe/$1"; }
fi
run setup.sh || fail "rxe0 setup"
echo "rxe-guest(guest): $(cut -d' ' -f1 /proc/uptime)s after boot; running the command"
echo "RXE_COMMAND_START"
run cmd.sh
code=$?
echo
echo "RXE_EXIT=$code"
poweroff -f
sleep 5
EOF
chmod +x "$stage/init"

cpio_create() { if command -v cpio >/dev/null; then cpio -o -H newc --quiet; else busybox cpio -o -H newc; fi; }
(cd "$stage" && find . | sort | cpio_create 2>/dev/null) | gzip -1 >"$initrd"

# ---- boot --------------------------------------------------------------------------------
qemu=(qemu-system-x86_64 -accel "$accel" -cpu max -smp "$smp" -m "$mem"
  -nodefaults -no-reboot -display none -monitor none -serial stdio
  -kernel "$vmlinuz" -initrd "$initrd"
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init")
if [[ $mode == virtfs ]]; then
  qemu+=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
fi
log=$workdir/console.$$.log
find "$workdir" -maxdepth 1 -name 'console.*.log' -mmin +1440 -delete 2>/dev/null || true
left=$((timeout_s - SECONDS))  # SECONDS: since the script started
if ((left <= 0)); then
  echo "rxe-guest: TIMEOUT: ${timeout_s}s spent before the guest could boot" >&2
  exit 124
fi
echo "rxe-guest: booting linux $kver ($accel, $mode, -smp $smp, ${mem} MiB; console also in $log; timeout ${timeout_s}s)"
start=$(date +%s)
set +e
timeout -k 10 "$left" "${qemu[@]}" </dev/null 2> >(grep -v 'TCG doesn.t support requested feature' >&2) |
  tr -d '\r' | tee "$log"
st=("${PIPESTATUS[@]}")
set -e
elapsed=$(($(date +%s) - start))
if [[ ${st[0]} == 124 || ${st[0]} == 137 ]]; then
  echo "rxe-guest: TIMEOUT: the guest ran past ${timeout_s}s and was killed (console: $log)" >&2
  exit 124
fi
code=$(sed -n 's/^RXE_EXIT=\([0-9]*\)$/\1/p' "$log" | tail -1)
if [[ -n $code ]]; then
  echo "rxe-guest: command exited $code (${elapsed}s boot + command)"
  exit "$code"
fi
if grep -q '^RXE_SETUP_FAILED' "$log"; then
  echo "rxe-guest: guest setup failed (console: $log)" >&2
else
  echo "rxe-guest: the guest stopped without reporting an exit code (qemu: ${st[0]}; console: $log)" >&2
fi
exit 1
