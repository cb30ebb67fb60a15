#!/usr/bin/env bash
# Checks that every C++/CUDA source follows .clang-format (tools/test.sh runs it first). Prints the
# files that differ and how to fix them; exits non-zero when any does. --fix rewrites them in place.
# Also checks the layering (docs/architecture.md): the core (engine/) includes no op, model, loop,
# data or app header; ops/ nothing above the core; train/ no model, data or app; data/ no model,
# loop or app; models/ no app.
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
layering=()
for rule in "engine:ops models train data apps" "ops:models train data apps" \
  "train:models data apps" "data:models train apps" "models:apps"; do
  dir="${rule%%:*}"
  for dep in ${rule#*:}; do
    while IFS= read -r hit; do layering+=("$hit (includes $dep/)"); done < <(
      git ls-files "$dir/*.h" "$dir/*.cpp" "$dir/*.cu" "$dir/*.cuh" |
        xargs -r grep -n "#include \"$dep/" || true)
  done
done
# A ';' in a Catch2 case's name is a CMake list separator: catch_discover_tests cuts the name there
# and its CTest entry matches no case (tests/CMakeLists.txt).
semicolons="$(git ls-files 'tests/*.cpp' 'tests/*.cu' | xargs -r python3 -c '
import re, sys
for f in sys.argv[1:]:
    s = open(f).read()
    for m in re.finditer(r"TEST_CASE\(\s*((?:\"(?:[^\"\\\\]|\\\\.)*\"\s*)+)", s):
        if ";" in m.group(1):
            print("  %s:%d" % (f, s.count("\n", 0, m.start()) + 1))
')"
if [ -n "$semicolons" ]; then
  echo "check_format: test case names with a ';' (ctest would cut them; use ','):" >&2
  echo "$semicolons" >&2
  exit 1
fi
if [ ${#layering[@]} -gt 0 ]; then
  echo "check_format: ${#layering[@]} includes break the layering (docs/architecture.md):" >&2
  printf '  %s\n' "${layering[@]}" >&2
  exit 1
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
