#!/usr/bin/env bash
# Training speed on one GPU, megaplan's CUDA executor side by side with PyTorch
# (bench/torch_gpt_reference.py: bf16 autocast, SDPA, fused AdamW, torch.compile), same model,
# micro-batch and sequence length, one microbatch per iteration. Prints a table last.
#   bench/train_speed.sh MEGAPLAN_BINARY OUT_DIR [MODEL ...]
# MODEL is NAME:MBS, default gpt2-124m:16 gpt2-350m:16 gpt-1.3b:8 (sequence lengths from the presets);
# llama-1b is issue 15's Llama-style ~1B (16 layers, hidden 2048, ffn 8192, 32 heads in 8 query
# groups, Llama 3's vocabulary untied, seq 4096), e.g. llama-1b:4; moe-2b its attention over 8 layers,
# each MLP 8 SwiGLU experts of 4096, top 2, the switch loss at 0.01 (bench/simulated_vs_measured.sh's MoE).
set -euo pipefail
megaplan=$1
out=$2
shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt2-124m:16 gpt2-350m:16 gpt-1.3b:8)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

# A corpus for the data loader: the token values do not change the work, so the byte tokenizer
# on text the machine carries (Python's standard library sources) is enough.
corpus="$out/corpus"
mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -1500)
"$megaplan" data prepare --tokenizer byte --append-eod --output-prefix "$corpus" --input "${files[@]}" > "$out/prepare.log"

declare -A layers=([gpt2-124m]=12 [gpt2-350m]=24 [gpt-1.3b]=24 [llama-1b]=16 [moe-2b]=8)
declare -A hidden=([gpt2-124m]=768 [gpt2-350m]=1024 [gpt-1.3b]=2048 [llama-1b]=2048 [moe-2b]=2048)
declare -A heads=([gpt2-124m]=12 [gpt2-350m]=16 [gpt-1.3b]=16 [llama-1b]=32 [moe-2b]=32)
# The published vocabularies (train would otherwise take the byte-level corpus's 257).
declare -A vocab=([gpt2-124m]=50257 [gpt2-350m]=50257 [gpt-1.3b]=50257 [llama-1b]=128256 [moe-2b]=128256)
declare -A seq=([gpt2-124m]=1024 [gpt2-350m]=1024 [gpt-1.3b]=2048 [llama-1b]=4096 [moe-2b]=4096)
# Models without a preset: megaplan's flags on a preset, and the PyTorch reference's.
declare -A megaplan_model=([llama-1b]="--model llama3-8b --num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 \
--num-attention-heads 32 --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096"
  [moe-2b]="--model llama3-8b --num-layers 8 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 \
--num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --num-experts 8 --moe-ffn-hidden-size 4096 \
--moe-router-topk 2 --moe-aux-loss-coeff 0.01")
declare -A torch_model=([llama-1b]="--llama --groups 8 --ffn 8192 --vocab 128256"
  [moe-2b]="--llama --groups 8 --ffn 8192 --vocab 128256 --experts 8 --topk 2 --moe-ffn 4096 --aux-coeff 0.01 --grouped")
iters=${MEGAPLAN_BENCH_ITERS:-30}
rows=()
for entry in "${models[@]}"; do
  name=${entry%%:*}
  mbs=${entry##*:}
  run="$name-$mbs"  # a model listed at two micro-batch sizes keeps both runs' files
  log="$out/$run.megaplan.jsonl"
  rm -f "$log"
  # shellcheck disable=SC2086  # the flags split on purpose
  "$megaplan" train ${megaplan_model[$name]:---model $name} --vocab-size "${vocab[$name]}" --device cuda --data-path "${corpus}_text_document" --split 1,0,0 --mbs "$mbs" --gbs "$mbs" \
    --train-iters "$iters" --log-interval 10 --eval-iters 0 --lr 1e-4 --log-file "$log" > "$out/$run.megaplan.txt" 2>&1 ||
    { echo "megaplan train failed for $name:"; tail -5 "$out/$run.megaplan.txt"; }
  python3 "$here/torch_gpt_reference.py" --layers "${layers[$name]}" --hidden "${hidden[$name]}" \
    --heads "${heads[$name]}" --seq "${seq[$name]}" --mbs "$mbs" ${torch_model[$name]:-} > "$out/$run.torch.json" 2> "$out/$run.torch.err" ||
    { echo "pytorch failed for $name:"; tail -5 "$out/$run.torch.err"; }
  rows+=("$name $mbs ${seq[$name]}")
done

python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'model':<11}{'mbs':>4}{'seq':>6} | {'megaplan tok/s':>14}{'TFLOP/s':>9}{'MFU':>6}{'peak GiB':>9} | "
      f"{'pytorch tok/s':>13}{'TFLOP/s':>9}{'peak GiB':>9} | ratio")
for row in sys.argv[2:]:
    name, mbs, seq = row.split()
    try:
        last = [json.loads(l) for l in open(f"{out}/{name}-{mbs}.megaplan.jsonl")][-1]
        ours = (last["tokens_per_s"], last["model_tflops_per_gpu"], last["mfu"], last["peak_memory_bytes"] / 2**30)
    except Exception:
        ours = None
    try:
        ref = json.loads(open(f"{out}/{name}-{mbs}.torch.json").read().strip().splitlines()[-1])
        theirs = (ref["tokens_per_s"], ref["model_tflops"], ref["peak_memory_bytes"] / 2**30)
    except Exception:
        theirs = None
    left = f"{ours[0]:>14.0f}{ours[1]:>9.1f}{ours[2]:>6.2f}{ours[3]:>9.1f}" if ours else f"{'failed':>38}"
    right = f"{theirs[0]:>13.0f}{theirs[1]:>9.1f}{theirs[2]:>9.1f}" if theirs else f"{'failed':>31}"
    ratio = f"{ours[0] / theirs[0]:.2f}" if ours and theirs else "-"
    print(f"{name:<11}{mbs:>4}{seq:>6} | {left} | {right} | {ratio}")
PY
