#!/usr/bin/env bash
# Builds the Debian packages (debian/: gradlaned, libgradlane1, libgradlane-dev,
# python3-gradlane) from this working tree, uncommitted changes included, and puts the .debs,
# .changes and .buildinfo in an output directory. docs/operations.md, "Debian packages".
#   deploy/package.sh                      -> build-deb/ (git-ignored)
#   deploy/package.sh --out DIR --jobs N   (N: parallel compile jobs; default nproc)
# dpkg-buildpackage builds in the source tree and writes its results next to it (../*.deb):
# it runs on a copy in a temporary directory, so neither the checkout nor its parent directory
# gets build outputs. Needs the build dependencies (deploy/install-deps.sh installs them); not
# root (Rules-Requires-Root: no).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$repo/build-deb
jobs=$(nproc)
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument $1 (--out DIR, --jobs N)" >&2; exit 2 ;;
  esac
done

for tool in dpkg-buildpackage dh dpkg-checkbuilddeps; do
  command -v "$tool" >/dev/null ||
    { echo "package.sh: $tool not found; run deploy/install-deps.sh (as root)" >&2; exit 1; }
done
(cd "$repo" && dpkg-checkbuilddeps) ||
  { echo "package.sh: run deploy/install-deps.sh (as root) for the build dependencies" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gradlane-deb.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
src=$tmp/gradlane
mkdir "$src"
# The source: what git tracks plus new files it does not ignore (so build*/ directories and
# caches stay behind), as they are in the working tree. Outside a git checkout: everything
# but build directories.
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do if [[ -e $f || -L $f ]]; then printf '%s\0' "$f"; fi; done |
     tar --null -T - -cf -) | tar -xf - -C "$src"
else
  tar -C "$repo" --exclude='./build*' --exclude='__pycache__' -cf - . | tar -xf - -C "$src"
fi

echo "package.sh: building in $src (parallel=$jobs)"
start=$SECONDS
# nocheck: the test suites need root and network namespaces (deploy/test.sh runs them; the
# package build configures them out anyway). -b: binary packages only (native source).
(cd "$src" && DEB_BUILD_OPTIONS="nocheck parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
   dpkg-buildpackage -b -us -uc) >"$tmp/build.log" 2>&1 ||
  { tail -n 60 "$tmp/build.log" >&2; echo "package.sh: dpkg-buildpackage failed" >&2; exit 1; }

mkdir -p "$out"
shopt -s nullglob
results=("$tmp"/*.deb "$tmp"/*.changes "$tmp"/*.buildinfo)
((${#results[@]})) || { echo "package.sh: no packages were written" >&2; exit 1; }
cp "${results[@]}" "$tmp/build.log" "$out/"
echo "package.sh: built in $((SECONDS - start)) s into $out:"
(cd "$out" && ls -1 ./*.deb)
