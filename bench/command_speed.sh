#!/usr/bin/env bash
# Whole-command speed of the commands that use no GPU, as a user runs them: wall and CPU seconds
# and peak resident memory (GNU time), the median of RUNS runs each. Issue 38's targets are the
# last column. Prints a table.
#   bench/command_speed.sh [MEGAPLAN_BINARY] [RUNS]    (default build/cli/megaplan, 5 runs)
set -euo pipefail
megaplan=${1:-build/cli/megaplan}
runs=${2:-5}
[ -x "$megaplan" ] || { echo "command_speed: no executable at $megaplan" >&2; exit 2; }

# name | target | arguments
commands=(
  "presets|<= 0.03 s, <= 80 MB|presets"
  "simulate gpt-1t tp 8 pp 64, 3072 A100|<= 0.05 s|simulate --model gpt-1t --cluster dgx-a100-80gb --gpus 3072 --gbs 3072 --tp 8 --pp 64"
  "search gpt-1t, 3072 A100, gbs 3072|<= 0.3 s|search --model gpt-1t --cluster dgx-a100-80gb --gpus 3072 --gbs 3072"
  "search gpt-1t, 8192 A100|<= 500 MB|search --model gpt-1t --cluster dgx-a100-80gb --gpus 8192"
  "search llama3.1-405b, 16384 H100, gbs 2048, seq 8192|<= 1 s|search --model llama3.1-405b --cluster dgx-h100 --gpus 16384 --gbs 2048 --seq-length 8192"
)

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR + 1) / 2)]}'; }
measured=$(mktemp)
trap 'rm -f "$measured"' EXIT

printf '%-55s %8s %8s %9s  %s\n' command "wall s" "cpu s" "peak MB" target
for entry in "${commands[@]}"; do
  IFS='|' read -r name target arguments <<< "$entry"
  walls=() cpus=() rss=()
  for _ in $(seq "$runs"); do
    # shellcheck disable=SC2086  # the arguments are a word list
    /usr/bin/time -o "$measured" -f '%e %U %S %M' "$megaplan" $arguments > /dev/null 2>&1
    read -r wall user system kb < "$measured"
    walls+=("$wall") cpus+=("$(awk -v u="$user" -v s="$system" 'BEGIN {printf "%.2f", u + s}')") rss+=("$kb")
  done
  printf '%-55s %8s %8s %9s  %s\n' "$name" "$(printf '%s\n' "${walls[@]}" | median)" \
    "$(printf '%s\n' "${cpus[@]}" | median)" "$(( $(printf '%s\n' "${rss[@]}" | median) / 1024 ))" "$target"
done
