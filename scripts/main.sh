#!/usr/bin/env bash
# Builds megaplan if needed and runs its main job. With no arguments: `megaplan search` on its
# embedded default, GPT-3 175B on 1024 A100-80GB GPUs at global batch 1536. With arguments: runs
# `megaplan ARGS...`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$("$root/scripts/build.sh")
if [ $# -eq 0 ]; then
  set -- search
fi
exec "$build_dir/cli/megaplan" "$@"
