#!/usr/bin/env bash
# Installs the Debian packages this project builds against. Idempotent: packages already present are skipped.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git libcaf-dev libboost1.81-dev libboost-json1.81-dev catch2
      libsentencepiece-dev libpcre2-dev libssl-dev nodejs npm python3 curl iproute2
      python3-dev pybind11-dev python3-pytest python3-jsonschema chromium)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from outside Debian (e.g. a preinstalled Node.js); do not fight it.
if command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<< "${missing[*]}"
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
