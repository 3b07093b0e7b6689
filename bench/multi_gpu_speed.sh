#!/usr/bin/env bash
# Training speed on two GPUs of one host, megaplan over NCCL (`megaplan launch`) beside PyTorch
# (bench/torch_gpt_reference.py under torchrun: DDP and FSDP2, bf16 autocast, SDPA, torch.compile),
# same model, micro-batch and sequence length. For each model: one GPU, then on two GPUs megaplan's
# dp 2 (--overlap-grad-reduce, with and without the distributed optimizer), tp 2 (sequence parallel),
# pp 2 (1F1B, 8 microbatches), and PyTorch's one GPU, DDP and FSDP. Data-parallel runs take
# MICROBATCHES micro-batches per GPU per iteration (default 2; one GPU the same), as a Megatron user's
# gradient accumulation does. tokens/s is the world's, taken from the last logged interval.
# Prints a table last.
#   [MICROBATCHES=N] [MEGAPLAN_BENCH_ITERS=N] [RUNS="1gpu dp2 ..."] bench/multi_gpu_speed.sh MEGAPLAN_BINARY OUT_DIR [MODEL ...]
# RUNS picks some of: 1gpu dp2 dp2-one-microbatch dp2-distopt tp2 pp2 torch-1gpu torch-ddp torch-fsdp (default all).
# MODEL is NAME:MBS: gpt-1.3b:8 (seq 2048) and llama-1b:4 (bench/train_speed.sh's Llama-style ~1B,
# seq 4096) by default.
set -uo pipefail
megaplan=$(realpath "$1")
out=$2
shift 2
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(gpt-1.3b:8 llama-1b:4)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
per_gpu=${MICROBATCHES:-2}
iters=${MEGAPLAN_BENCH_ITERS:-30}
runs=" ${RUNS:-1gpu dp2 dp2-one-microbatch dp2-distopt tp2 pp2 torch-1gpu torch-ddp torch-fsdp} "
picked() { [[ $runs == *" $1 "* ]]; }

mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -1500)
"$megaplan" data prepare --tokenizer byte --append-eod --output-prefix "$out/corpus" --input "${files[@]}" > "$out/prepare.log"

declare -A megaplan_model=([gpt-1.3b]="--model gpt-1.3b --vocab-size 50257"
  [llama-1b]="--model llama3-8b --num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 \
--num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256")
declare -A torch_model=([gpt-1.3b]="--layers 24 --hidden 2048 --heads 16 --seq 2048"
  [llama-1b]="--layers 16 --hidden 2048 --heads 32 --seq 4096 --llama --groups 8 --ffn 8192 --vocab 128256")

# ours NAME MODEL MBS GBS WORLD FLAGS...: megaplan, one process per GPU under `megaplan launch`.
ours() {
  local name=$1 model=$2 mbs=$3 gbs=$4 world=$5
  shift 5
  rm -f "$out/$name.jsonl"
  # shellcheck disable=SC2086
  timeout 400 "$megaplan" launch --nproc-per-node "$world" -- train ${megaplan_model[$model]} --device cuda \
    --data-path "$out/corpus_text_document" --split 1,0,0 --mbs "$mbs" --gbs "$gbs" --train-iters "$iters" --log-interval 10 \
    --eval-iters 0 --lr 1e-4 "$@" --log-file "$out/$name.jsonl" > "$out/$name.txt" 2>&1 ||
    echo "megaplan $name failed: $(tail -1 "$out/$name.txt")"
}
# theirs NAME MODEL MBS WORLD PARALLEL: PyTorch under torchrun (one GPU: plain python).
theirs() {
  local name=$1 model=$2 mbs=$3 world=$4 parallel=$5 start=(python3)
  [ "$world" -gt 1 ] && start=(torchrun --nproc-per-node "$world" --master-port 29631)
  # shellcheck disable=SC2086
  timeout 400 "${start[@]}" "$here/torch_gpt_reference.py" ${torch_model[$model]} --mbs "$mbs" --parallel "$parallel" \
    --microbatches "$per_gpu" --iters "$iters" > "$out/$name.json" 2> "$out/$name.err" ||
    echo "pytorch $name failed: $(tail -1 "$out/$name.err")"
}

rows=()
for entry in "${models[@]}"; do
  model=${entry%%:*}
  mbs=${entry##*:}
  picked 1gpu && ours "$model-1gpu" "$model" "$mbs" $((mbs * per_gpu)) 1
  picked dp2 && ours "$model-dp2" "$model" "$mbs" $((mbs * per_gpu * 2)) 2 --overlap-grad-reduce
  picked dp2-one-microbatch && ours "$model-dp2-one-microbatch" "$model" "$mbs" $((mbs * 2)) 2 --overlap-grad-reduce
  picked dp2-distopt && ours "$model-dp2-distopt" "$model" "$mbs" $((mbs * per_gpu * 2)) 2 --overlap-grad-reduce \
    --use-distributed-optimizer --overlap-param-gather
  picked tp2 && ours "$model-tp2" "$model" "$mbs" $((mbs * per_gpu)) 2 --tp 2 --sequence-parallel
  picked pp2 && ours "$model-pp2" "$model" "$mbs" $((mbs * 8)) 2 --pp 2
  picked torch-1gpu && theirs "$model-torch-1gpu" "$model" "$mbs" 1 none
  picked torch-ddp && theirs "$model-torch-ddp" "$model" "$mbs" 2 ddp
  picked torch-fsdp && theirs "$model-torch-fsdp" "$model" "$mbs" 2 fsdp
  rows+=("$model $mbs")
done

python3 - "$out" "$per_gpu" "$runs" "${rows[@]}" <<'PY'
import json, sys
out, per_gpu, picked = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
def ours(name):
    try:
        last = [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"loss"' in l][-1]
        return last["tokens_per_s"], last["model_tflops_per_gpu"], last["peak_memory_bytes"] / 2**30
    except Exception:
        return None
def theirs(name):
    try:
        last = json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
        return last["tokens_per_s"], last["model_tflops"], last["peak_memory_bytes"] / 2**30
    except Exception:
        return None
print(f"{'model':<10}{'mbs':>4} {'run':<40}{'GPUs':>5}{'tokens/s':>11}{'TFLOP/s/GPU':>12}{'peak GiB':>9}{'vs 1 GPU':>9}")
for row in sys.argv[4:]:
    model, mbs = row.split()
    runs = [("1gpu", f"megaplan, one GPU, {per_gpu} microbatches", 1, ours(f"{model}-1gpu")),
            ("dp2", f"megaplan dp 2, {per_gpu} microbatches per GPU", 2, ours(f"{model}-dp2")),
            ("dp2-one-microbatch", "megaplan dp 2, one microbatch per GPU", 2, ours(f"{model}-dp2-one-microbatch")),
            ("dp2-distopt", "megaplan dp 2, distributed optimizer", 2, ours(f"{model}-dp2-distopt")),
            ("tp2", "megaplan tp 2, sequence parallel", 2, ours(f"{model}-tp2")),
            ("pp2", "megaplan pp 2, 1F1B, 8 microbatches", 2, ours(f"{model}-pp2")),
            ("torch-1gpu", f"PyTorch, one GPU, {per_gpu} microbatches", 1, theirs(f"{model}-torch-1gpu")),
            ("torch-ddp", f"PyTorch DDP, {per_gpu} microbatches per GPU", 2, theirs(f"{model}-torch-ddp")),
            ("torch-fsdp", f"PyTorch FSDP2, {per_gpu} microbatches per GPU", 2, theirs(f"{model}-torch-fsdp"))]
    # Scaling against each framework's one-GPU run (PyTorch's, else megaplan's where not run).
    base = {"megaplan": runs[0][3], "PyTorch": runs[6][3] or runs[0][3]}
    for key, label, gpus, result in runs:
        if key not in picked:
            continue
        if result is None:
            print(f"{model:<10}{mbs:>4} {label:<40}{gpus:>5}{'failed':>11}")
            continue
        one = base[label.split(",")[0].split()[0]]
        scale = f"{result[0] / one[0]:.2f}x" if one else "-"
        print(f"{model:<10}{mbs:>4} {label:<40}{gpus:>5}{result[0]:>11.0f}{result[1]:>12.1f}{result[2]:>9.1f}{scale:>9}")
PY
