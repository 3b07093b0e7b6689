#!/usr/bin/env bash
# gpt2-124m on real text on one GPU, bf16 against --fp16 with Megatron's dynamic loss scaler: the
# same run twice, then the final losses side by side, the scaler's skipped iterations and its scale
# over the run. Prints a summary last.
#   bench/train_fp16.sh MEGAPLAN_BINARY DATA_PREFIX OUT_DIR [ITERATIONS]
set -euo pipefail
megaplan=$1
data=$2
out=$3
iterations=${4:-300}
mkdir -p "$out"
# shellcheck source=bench/real_text_run.sh
source "$(dirname "$0")/real_text_run.sh"
common=("${real_text_run[@]}" --train-iters "$iterations" --eval-interval "$iterations" --eval-iters 4 --log-interval 1)
for precision in bf16 fp16; do
  "$megaplan" train "${common[@]}" "--$precision" --log-file "$out/$precision.jsonl" > "$out/$precision.txt" 2>&1
done
python3 - "$out" "$iterations" <<'PY'
import json, sys
out, iterations = sys.argv[1], int(sys.argv[2])
def records(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
bf16 = [r for r in records("bf16") if "loss" in r]
fp16 = [r for r in records("fp16") if "loss" in r]
valid = {n: [r["validation_loss"] for r in records(n) if "validation_loss" in r] for n in ("bf16", "fp16")}
def tail_mean(rs):  # the last 20 iterations' training loss
    tail = rs[-20:]
    return sum(r["loss"] for r in tail) / len(tail)
b, f = tail_mean(bf16), tail_mean(fp16)
skipped = [r["iteration"] for r in fp16 if r["skipped_iterations"]]
scales = sorted({r["loss_scale"] for r in fp16})
speed = {n: sum(r["tokens_per_s"] for r in rs[-20:]) / 20 for n, rs in (("bf16", bf16), ("fp16", fp16))}
print(f"| precision | iterations | loss (mean of the last 20) | validation loss | tokens/s (last 20) |")
print(f"|---|---|---|---|---|")
print(f"| bf16 | {len(bf16)} | {b:.4f} | {valid['bf16'][-1]:.4f} | {speed['bf16']:,.0f} |")
print(f"| fp16 | {len(fp16)} | {f:.4f} | {valid['fp16'][-1]:.4f} | {speed['fp16']:,.0f} |")
print(f"fp16 vs bf16 final loss: {100 * (f - b) / b:+.2f}% (target within 2%)")
print(f"fp16 skipped {len(skipped)} iterations: {skipped[:40]}{' ...' if len(skipped) > 40 else ''}")
print(f"fp16 loss scale from {fp16[0]['loss_scale']:.6g} to {fp16[-1]['loss_scale']:.6g}; values seen: {len(scales)}")
PY
