#!/usr/bin/env bash
# Installs megaplan's build dependencies from Debian packages. Idempotent: installs only what is
# missing. As root it runs apt-get itself; otherwise it prints the one line to run and fails.
set -euo pipefail

packages=(cmake g++ make libcli11-dev nlohmann-json3-dev libboost-graph-dev catch2 libbenchmark-dev libopenmpi-dev
  libpcre2-dev libutf8proc-dev libsentencepiece-dev sentencepiece librandom123-dev libxxhash-dev pkg-config node-d3
  chromium python3 strace clang libclang-rt-14-dev)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "megaplan setup: missing packages; run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "megaplan setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
