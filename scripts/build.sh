#!/usr/bin/env bash
# Installs missing dependencies, configures (once) and builds megaplan.
#   MEGAPLAN_BUILD_DIR   build folder (default: build)
#   MEGAPLAN_CMAKE_ARGS  extra CMake arguments for the first configure
#   MEGAPLAN_JOBS        parallel build jobs (default: 2)
#   MEGAPLAN_TARGETS     the targets to build, space-separated (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${MEGAPLAN_BUILD_DIR:-build}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac

"$root/scripts/setup.sh"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  # shellcheck disable=SC2086  # MEGAPLAN_CMAKE_ARGS is a list of arguments
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${MEGAPLAN_CMAKE_ARGS:-} >&2
fi
# Build output goes to stderr: stdout carries only the build folder, for the calling script.
targets=()
for target in ${MEGAPLAN_TARGETS:-}; do targets+=(--target "$target"); done
cmake --build "$build_dir" -j "${MEGAPLAN_JOBS:-2}" "${targets[@]}" >&2
echo "$build_dir"
