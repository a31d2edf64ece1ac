#!/usr/bin/env bash
# Installs every system dependency on a fresh Debian 12 machine (run as root). Idempotent: skips
# apt when everything is already there.
set -euo pipefail
PKGS=(openmpi-bin libopenmpi-dev libboost-dev libfmt-dev pybind11-dev libgtest-dev cmake g++
      ninja-build ccache dataset-fashion-mnist clang-format iproute2)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
