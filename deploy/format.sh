#!/usr/bin/env bash
# Formats gradlane's C and C++ sources (*.h, *.cc, *.c under shm, libclient, sched, transport,
# daemon, tests and examples) with clang-format and the repository's .clang-format.
#   deploy/format.sh            format them in place
#   deploy/format.sh --check    change nothing: list the files that are not formatted and exit 1
#                               if there is one (0: all formatted)
# Only files git tracks are formatted: build directories and anything generated stay out, and
# so would vendored code (none today; add it to `skip`). CLANG_FORMAT picks the binary
# (default clang-format; the style is tuned to Debian 12's clang-format 14).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=fix
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac
clang_format=${CLANG_FORMAT:-clang-format}
if ! command -v "$clang_format" >/dev/null; then
  echo "format.sh: $clang_format not found (Debian: apt-get install clang-format)" >&2
  exit 2
fi

dirs=(shm libclient sched transport daemon tests examples)
skip=()  # git pathspecs of third-party or generated files, e.g. ':(exclude)daemon/vendor/*'
specs=()
for d in "${dirs[@]}"; do specs+=("$d/*.h" "$d/*.cc" "$d/*.c"); done
mapfile -d '' files < <(git ls-files -z -- "${specs[@]}" "${skip[@]}")
if ((${#files[@]} == 0)); then
  echo "format.sh: no sources found (is this a git checkout?)" >&2
  exit 2
fi

jobs=$(nproc)
if [[ $mode == fix ]]; then
  printf '%s\0' "${files[@]}" | xargs -0 -n 8 -P "$jobs" "$clang_format" --style=file -i
  exit 0
fi
# One clang-format per file, so that each file that would change is named once.
unformatted=$(printf '%s\0' "${files[@]}" |
  xargs -0 -n 1 -P "$jobs" sh -c \
    '"$0" --style=file --dry-run --Werror "$1" >/dev/null 2>&1 || printf "%s\n" "$1"' \
    "$clang_format" | sort)
if [[ -n $unformatted ]]; then
  echo "$unformatted"
  echo "format.sh: $(wc -l <<<"$unformatted") of ${#files[@]} files are not formatted" \
    "(deploy/format.sh formats them)" >&2
  exit 1
fi
echo "format.sh: all ${#files[@]} files formatted"
