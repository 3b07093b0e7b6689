#!/usr/bin/env bash
# Builds megaplan if needed and runs its main job. With no arguments: simulate the PTD-P paper's
# GPT-3 175B layout on 1024 A100-80GB GPUs (tp 8, pp 16, gbs 1536, sequence parallelism); it
# becomes `megaplan search` when the planner lands. With arguments: runs `megaplan ARGS...`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$("$root/scripts/build.sh")
if [ $# -eq 0 ]; then
  set -- simulate --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 --gbs 1536 --sequence-parallel
fi
exec "$build_dir/cli/megaplan" "$@"
