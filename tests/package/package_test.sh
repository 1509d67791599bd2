#!/usr/bin/env bash
# package_test (suite 'package', issue #17): the Debian packages build, pass lintian with no
# error, and work once installed. Builds them with deploy/package.sh into a temporary
# directory, runs lintian, checks what each package holds (the conffile, the maintainer
# scripts debhelper generated, the library's exported symbols), unpacks them into a
# throw-away root with `dpkg -x` and there checks
#   - gradlaned --help, and that every binary's shared libraries resolve;
#   - `import gradlane` with the system python3, loading the root's libgradlane.so.1;
#   - `pkg-config --cflags --libs gradlane` (PKG_CONFIG_SYSROOT_DIR), and a C++ program built
#     with those flags against gradlane.hpp that runs;
#   - `systemd-analyze verify --root` of the installed unit (ExecStart resolved in the root).
# Why dpkg -x and not `dpkg --root`: dpkg --root needs a dpkg database and every dependency
# (libc, Abseil, DPDK) in the root, and runs the maintainer scripts chrooted there (no shell
# inside) or, with --force-script-chrootless, on this host as root — where a wrong DPKG_ROOT
# guard would create or delete the host's own 'gradlane' account. Unpacking uses the host's
# libraries (the same Debian 12 ones the packages depend on) and checks the scripts' text.
# Skips (77) only without dpkg-buildpackage or lintian (deploy/install-deps.sh installs both).
#   package_test.sh SOURCE_ROOT        (GRADLANE_PACKAGE_JOBS: compile jobs, default nproc)
set -uo pipefail
src=$1
for tool in dpkg-buildpackage lintian; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool not installed (packages dpkg-dev, debhelper, dh-python, lintian:" \
         "deploy/install-deps.sh)"
    exit 77
  fi
done
# meson test sets it to catch our own use of freed memory; it only slows the compilers here.
unset MALLOC_PERTURB_

failed=0
fail() { echo "FAIL: $*" >&2; failed=1; }
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }
tmp=$(mktemp -d /tmp/gl-package-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/out root=$tmp/root
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)

step "uptime: $(uptime)"
step "deploy/package.sh (parallel=${GRADLANE_PACKAGE_JOBS:-$(nproc)})"
if ! "$src/deploy/package.sh" --out "$out" --jobs "${GRADLANE_PACKAGE_JOBS:-$(nproc)}"; then
  echo "FAIL: deploy/package.sh" >&2
  exit 1
fi
version=$(cd "$src" && dpkg-parsechangelog -S Version)
meson_version=$(sed -n "s/^ *version : '\([^']*\)'.*/\1/p" "$src/meson.build" | head -1)
[[ $version == "$meson_version" ]] ||
  fail "debian/changelog is at $version, meson.build at $meson_version: add a changelog entry"
declare -A deb
for p in gradlaned libgradlane1 libgradlane-dev python3-gradlane; do
  a=$arch
  [[ $p == python3-gradlane ]] && a=all
  deb[$p]=$out/${p}_${version}_${a}.deb
  [[ -f ${deb[$p]} ]] || fail "no ${deb[$p]##*/} (built: $(cd "$out" && echo *.deb))"
done
((failed == 0)) || exit 1

step "lintian (no error allowed; warnings and info listed)"
# --fail-on error: warnings are listed for a person to judge, errors fail the test. As root
# lintian warns that it should not run as root: that line is not about the packages.
lintian --fail-on error --display-info --tag-display-limit 0 "$out"/*.changes \
  2>&1 | grep -v '^running with root privileges is not recommended!$'
((PIPESTATUS[0] == 0)) || fail "lintian reported errors"

step "package contents and maintainer scripts"
contents() { dpkg-deb -c "$1" | awk '{print $6}' | sed 's#^\./#/#'; }
has() {  # deb path...
  local d=$1 list; shift
  list=$(contents "$d")
  for f in "$@"; do grep -qxF -- "$f" <<<"$list" || fail "${d##*/} lacks $f"; done
}
has "${deb[gradlaned]}" /usr/sbin/gradlaned /usr/bin/gradlanectl /lib/systemd/system/gradlaned.service \
  /usr/lib/sysusers.d/gradlane.conf /etc/gradlane/gradlaned.conf /usr/share/gradlane/prometheus.yml \
  /usr/share/gradlane/gradlane-alerts.yml /usr/share/gradlane/grafana-dashboard.json
has "${deb[libgradlane1]}" "/usr/lib/$triplet/libgradlane.so.1"
has "${deb[libgradlane-dev]}" "/usr/lib/$triplet/libgradlane.so" /usr/include/gradlane/gradlane.h \
  /usr/include/gradlane/gradlane.hpp /usr/include/gradlane/shm/abi.h "/usr/lib/$triplet/pkgconfig/gradlane.pc"
has "${deb[python3-gradlane]}" /usr/lib/python3/dist-packages/gradlane/__init__.py
mkdir "$tmp/control"
dpkg-deb -e "${deb[gradlaned]}" "$tmp/control"
grep -qxF /etc/gradlane/gradlaned.conf "$tmp/control/conffiles" || fail "gradlaned.conf is not a conffile"
for s in postinst prerm postrm; do
  [[ -f $tmp/control/$s ]] || { fail "gradlaned has no $s"; continue; }
  sh -n "$tmp/control/$s" || fail "gradlaned $s: shell syntax"
done
# postinst: the account exists before the unit is enabled and started (User=gradlane).
awk '/systemd-sysusers/ && !u {u=NR} /deb-systemd-helper enable/ && !e {e=NR}
     /deb-systemd-invoke \$_dh_action/ && !s {s=NR}
     END {exit !(u && e && s && u < e && e < s)}' "$tmp/control/postinst" ||
  fail "postinst: expected systemd-sysusers, then enable, then start"
grep -q "deb-systemd-invoke stop 'gradlaned.service'" "$tmp/control/prerm" || fail "prerm does not stop the unit"
for w in "deb-systemd-helper purge 'gradlaned.service'" 'userdel' '/run/gradlane'; do
  grep -qF -- "$w" "$tmp/control/postrm" || fail "postrm (purge) lacks: $w"
done
# The library exports the C ABI only, every symbol at version GRADLANE_1 or at the later node
# (GRADLANE_1.N) that libclient/gradlane.map adds it in.
mkdir "$tmp/lib"
dpkg -x "${deb[libgradlane1]}" "$tmp/lib"
exported=$(nm -D --defined-only "$tmp/lib/usr/lib/$triplet/libgradlane.so.1" | awk '{print $3}')
others=$(grep -v -E -e '^gl_[a-z_]*@@GRADLANE_1(\.[0-9]+)?$' -e '^GRADLANE_1(\.[0-9]+)?$' <<<"$exported")
[[ -z $others ]] || fail "libgradlane.so.1 exports more than gl_*@@GRADLANE_1[.N]: $others"
# Each call of a later node is exported at exactly that node's version.
while read -r node name; do
  grep -qxF "$name@@$node" <<<"$exported" || fail "libgradlane.so.1 lacks $name@@$node (libclient/gradlane.map)"
done < <(awk '/^GRADLANE_1\.[0-9]+ *\{/ {node=$1} node && /^ *gl_[a-z_]*;/ {gsub(/[ ;]/, ""); print node, $0}
               /^}/ {node=""}' "$src/libclient/gradlane.map")
grep -q '^gl_connect@@GRADLANE_1$' <<<"$exported" || fail "libgradlane.so.1 does not export gl_connect"

step "unpack into a throw-away root ($root)"
mkdir "$root"
for p in "${!deb[@]}"; do dpkg -x "${deb[$p]}" "$root" || fail "dpkg -x ${deb[$p]##*/}"; done
export LD_LIBRARY_PATH=$root/usr/lib/$triplet

step "gradlaned --help; shared libraries of the binaries"
for b in usr/sbin/gradlaned usr/bin/gradlanectl usr/bin/gradlane-sim "usr/lib/$triplet/libgradlane.so.1"; do
  missing=$(ldd "$root/$b" 2>&1 | grep 'not found')
  [[ -z $missing ]] || fail "$b: $missing"
done
# Abseil's --help exits 1 after printing; what matters is that the daemon's flags are listed.
help=$("$root/usr/sbin/gradlaned" --help 2>&1)
for f in --socket --listen --metrics_address --admin_socket; do
  grep -q -- "$f" <<<"$help" || fail "gradlaned --help does not list $f: $help"
done
"$root/usr/bin/gradlanectl" --help >/dev/null 2>&1
(($? != 127)) || fail "gradlanectl does not run"

step "import gradlane (/usr/bin/python3, PYTHONPATH and LD_LIBRARY_PATH in the root)"
# A clean environment (no GRADLANE_LIB, no user site-packages): the package must come from the
# root and load the root's libgradlane.so.1 by its soname, as on an installed system.
env -i PATH=/usr/bin:/bin PYTHONPATH="$root/usr/lib/python3/dist-packages" \
  LD_LIBRARY_PATH="$LD_LIBRARY_PATH" /usr/bin/python3 -s - "$root" <<'PY' || fail "import gradlane"
import sys
import gradlane
root = sys.argv[1]
assert gradlane.__file__.startswith(root + "/"), gradlane.__file__
libs = {l.split()[-1] for l in open("/proc/self/maps") if "libgradlane" in l}
assert libs and all(p.startswith(root + "/") for p in libs), libs
try:
    gradlane.Client("/nonexistent/gradlaned.sock")
    raise SystemExit("connected to a socket that does not exist")
except gradlane.Error as e:
    print("import gradlane:", gradlane.__file__, "library", sorted(libs), "connect error:", e)
PY

step "pkg-config --cflags --libs gradlane (sysroot: the root); a C++ client built with it"
pc() {
  PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_LIBDIR=$root/usr/lib/$triplet/pkgconfig:$root/usr/share/pkgconfig \
    pkg-config "$@" gradlane
}
if libs=$(pc --libs) && cflags=$(pc --cflags); then
  echo "pkg-config: $cflags $libs"
  [[ $libs == *"-L$root/usr/lib/$triplet"*"-lgradlane"* ]] || fail "pkg-config --libs: $libs"
  cat >"$tmp/client.cc" <<'CC'
// Builds against the installed headers only: gradlane.hpp is header-only over gradlane.h.
#include <gradlane.hpp>
#include <cstdio>
int main() {
  gl_connect_options o{};
  o.socket_path = "/nonexistent/gradlaned.sock";
  gradlane::Client c;
  gradlane::Result r = gradlane::Client::Connect(o, &c);
  std::printf("client: connect -> %d (%s): %s\n", r.code, gl_strerror(r.code), r.message.c_str());
  return r.ok() ? 1 : 0;
}
CC
  # shellcheck disable=SC2086
  g++ -std=c++20 $cflags "$tmp/client.cc" -o "$tmp/client" $libs || fail "C++ client does not build"
  [[ -x $tmp/client ]] && { "$tmp/client" || fail "C++ client"; }
else
  fail "pkg-config gradlane"
fi

step "systemd-analyze verify --root (the installed unit)"
# The root has only the packages' files; the unit's dependencies (sysinit.target,
# network-online.target, system.slice, ...) are every systemd system's, so the host's targets
# and slices are copied into the root's /usr/lib/systemd/system (the package's unit is in
# /lib/systemd/system). ExecStart=/usr/sbin/gradlaned is then looked up in the root.
mkdir -p "$root/usr/lib/systemd/system" "$root/etc/systemd/system"
find /lib/systemd/system -maxdepth 1 \( -name '*.target' -o -name '*.slice' \) \
  -exec cp -L {} "$root/usr/lib/systemd/system/" \;
if v=$(systemd-analyze verify --root="$root" gradlaned.service 2>&1) && [[ -z $v ]]; then
  echo "systemd-analyze verify: clean"
else
  fail "systemd-analyze verify gradlaned.service: $v"
fi
# The check is not vacuous: the same unit with an ExecStart missing from the root fails.
sed 's#^ExecStart=/usr/sbin/gradlaned #ExecStart=/usr/sbin/gradlaned-absent #' \
  "$root/lib/systemd/system/gradlaned.service" >"$root/etc/systemd/system/gl-absent.service"
systemd-analyze verify --root="$root" gl-absent.service >/dev/null 2>&1 &&
  fail "systemd-analyze verify --root accepted an ExecStart that is not in the root"

step "done (failed=$failed)"
exit "$failed"
