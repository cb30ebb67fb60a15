#!/usr/bin/env bash
# Every app prints "<name> <version> (commit <git describe>)" for --version and exits 0.
set -u
bin="$1"; version="$2"; shift 2
fail=0
for app in "$@"; do
  out="$("$bin/$app" --version 2>&1)"; rc=$?
  if [ $rc -eq 0 ] && [[ "$out" =~ ^$app\ $version\ \(commit\ [^\)]+\)$ ]]; then
    echo "ok   $out"
  else
    echo "FAIL $app --version: exit $rc, '$out'"; fail=1
  fi
done
exit $fail
