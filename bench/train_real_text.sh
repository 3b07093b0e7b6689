#!/usr/bin/env bash
# gpt2-124m on real text on one GPU: validation loss over a short run, then a resume check (a run
# stopped by --exit-interval and resumed with --load must log the uninterrupted run's losses
# bit for bit). Prints a summary last.
#   bench/train_real_text.sh MEGAPLAN_BINARY DATA_PREFIX OUT_DIR [ITERATIONS]
set -euo pipefail
megaplan=$1
data=$2
out=$3
iterations=${4:-300}
mkdir -p "$out"
# shellcheck source=bench/real_text_run.sh
source "$(dirname "$0")/real_text_run.sh"
common=("${real_text_run[@]}")

"$megaplan" train "${common[@]}" --train-iters "$iterations" --eval-interval 50 --eval-iters 4 --log-interval 10 \
  --log-file "$out/run.jsonl" > "$out/run.txt" 2>&1

rm -rf "$out/checkpoints"
"$megaplan" train "${common[@]}" --train-iters 30 --eval-iters 0 --log-interval 1 --log-file "$out/whole.jsonl" \
  > "$out/whole.txt" 2>&1
"$megaplan" train "${common[@]}" --train-iters 30 --eval-iters 0 --log-interval 1 --log-file "$out/parts.jsonl" \
  --save "$out/checkpoints" --exit-interval 15 > "$out/part1.txt" 2>&1
"$megaplan" train "${common[@]}" --train-iters 30 --eval-iters 0 --log-interval 1 --log-file "$out/parts.jsonl" \
  --load "$out/checkpoints" > "$out/part2.txt" 2>&1

grep "validation loss" "$out/run.txt" || true
tail -1 "$out/run.jsonl"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
whole = [json.loads(l)["loss"] for l in open(f"{out}/whole.jsonl")]
parts = [json.loads(l)["loss"] for l in open(f"{out}/parts.jsonl")]
same = len(whole) == len(parts) == 30 and all(a == b for a, b in zip(whole, parts))
print(f"resume: {len(whole)} uninterrupted and {len(parts)} resumed losses, bit-exact: {same}")
PY
