#!/usr/bin/env bash
# Builds megaplan if needed and runs the whole test suite. GPU tests (ctest label "gpu") skip
# with a message where no GPU is present. Extra arguments go to ctest (e.g. -L gpu, -R core).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$("$root/scripts/build.sh")
cd "$build_dir"
ctest --output-on-failure -j "${MEGAPLAN_JOBS:-2}" "$@"
