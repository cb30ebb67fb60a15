#!/usr/bin/env bash
# Sourced by tools/setup.sh and tools/fuzz.sh: install_packages WHO PACKAGE... installs, with
# apt-get, those of the Debian packages that are not installed yet (as root, or through sudo);
# WHO prefixes its messages.
install_packages() {
  local who="$1"
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "$who: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "$who: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}
