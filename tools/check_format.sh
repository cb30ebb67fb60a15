#!/usr/bin/env bash
# Checks that every C++/CUDA source follows .clang-format (tools/test.sh runs it first). Prints the
# files that differ and how to fix them; exits non-zero when any does. --fix rewrites them in place.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FORMAT="${CLANG_FORMAT:-clang-format}"
command -v "$FORMAT" >/dev/null || { echo "check_format: $FORMAT not found (apt-get install clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$FORMAT" -i --style=file "${files[@]}"
  echo "check_format: formatted ${#files[@]} files"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$FORMAT" --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} files differ from .clang-format ($("$FORMAT" --version)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "fix with: tools/check_format.sh --fix   (or $FORMAT -i FILE)" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files follow .clang-format"
