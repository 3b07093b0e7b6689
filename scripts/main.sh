#!/usr/bin/env bash
# Builds the megaplan binary if needed and runs its main job. With no arguments: `megaplan search`
# on its embedded default, GPT-3 175B on 1024 A100-80GB GPUs at global batch 1536. With
# arguments: runs `megaplan ARGS...`.
# The first result fast: the binary alone, without its CUDA kernels (planning, simulating, reports
# and CPU training need none), as a unity build (a few files to a compiler run), in its own folder
# build-main (MEGAPLAN_BUILD_DIR overrides it). GPU training is scripts/build.sh's build/cli/megaplan.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$(MEGAPLAN_BUILD_DIR=${MEGAPLAN_BUILD_DIR:-build-main} MEGAPLAN_TARGETS=megaplan \
  MEGAPLAN_CMAKE_ARGS="-DMEGAPLAN_CUDA=OFF -DMEGAPLAN_BENCHMARKS=OFF -DCMAKE_UNITY_BUILD=ON ${MEGAPLAN_CMAKE_ARGS:-}" \
  "$root/scripts/build.sh")
if [ $# -eq 0 ]; then
  set -- search
fi
exec "$build_dir/cli/megaplan" "$@"
