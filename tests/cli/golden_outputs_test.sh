#!/usr/bin/env bash
# The planner's and simulator's answers (and describe's and schedule's), byte for byte, on a
# recorded set of plans: a reshape must
# not move a number. When a change is meant to move them, rerun with --update and say why in the
# commit. search's "seconds" (its own wall time) is the one field left out of the comparison; its
# searches run on one thread, because with several the pruning counts depend on which worker
# finishes first (the plans do not).
#   usage: golden_outputs_test.sh MEGAPLAN_BINARY GOLDEN_DIR [--update]
set -uo pipefail
megaplan=$1
golden=$2
update=${3:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

# check NAME ARGS...: run megaplan ARGS (JSON out), compare stdout with GOLDEN_DIR/NAME.json.
check() {
  local name=$1
  shift
  if ! "$megaplan" "$@" 2>"$scratch/err" | grep -v '^  "seconds": ' >"$scratch/$name.json"; then
    echo "FAIL: megaplan $* exited non-zero: $(cat "$scratch/err")" >&2
    failures=$((failures + 1))
    return
  fi
  if [ "$update" = --update ]; then
    cp "$scratch/$name.json" "$golden/$name.json"
  elif ! diff -u "$golden/$name.json" "$scratch/$name.json" >"$scratch/$name.diff"; then
    echo "FAIL: megaplan $* differs from $name.json:" >&2
    head -40 "$scratch/$name.diff" >&2
    failures=$((failures + 1))
  fi
}

dropout=(--hidden-dropout 0.1 --attention-dropout 0.1)
check simulate_gpt3_175b simulate --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 \
  --global-batch-size 1536 --json
check simulate_llama3_8b simulate --model llama3-8b --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 \
  --global-batch-size 64 "${dropout[@]}" --json
check simulate_gpt2_124m simulate --model gpt2-124m --cluster h200-x1 --micro-batch-size 16 \
  --global-batch-size 32 "${dropout[@]}" --json
check simulate_llama3_70b_interleaved simulate --model llama3-70b --cluster dgx-h100 --gpus 64 --tp 4 --pp 4 \
  --vpp 5 --sequence-parallel --use-distributed-optimizer --recompute-activations --global-batch-size 128 --json
check simulate_gpt_1t_megatron simulate --model gpt-1t --cluster dgx-a100-80gb --gpus 3072 --tp 8 --pp 64 \
  --global-batch-size 3072 --implementation megatron-core --context-parallel-size 1 --json
check search_llama3_8b search --model llama3-8b --cluster dgx-h100 --gpus 8 --threads 1 --json
check search_llama3_70b_megatron search --model llama3-70b --cluster dgx-h100 --gpus 64 --global-batch-size 128 \
  --implementation megatron-core --threads 1 --json
check describe_gpt3_175b_uneven describe --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 \
  --global-batch-size 1536 --decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 7 --json
check schedule_interleaved_lowered schedule --kind interleaved --pp 2 --vpp 2 --microbatches 4 --lowered --format json
check schedule_dualpipev schedule --kind dualpipev --pp 4 --microbatches 8 --format json
# 126 layers: uneven pipeline splits, whose parameters per GPU differ at the same tp, pp and vpp.
check search_llama31_405b_uneven search --model llama3.1-405b --cluster dgx-h100 --gpus 256 --global-batch-size 256 \
  --threads 1 --json

if [ "$failures" -ne 0 ]; then
  echo "$failures golden outputs differ" >&2
  exit 1
fi
echo "golden outputs: all equal"
