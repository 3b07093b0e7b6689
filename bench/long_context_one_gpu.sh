#!/usr/bin/env bash
# Long context end to end (issue 39): search Llama-3-8B at seq 131072 on 8 H200s, then train the
# best plan's layout with the same shapes per layer on the one lent GPU, its 8 ranks as threads.
# Trimmed to fit one GPU's memory for all 8 ranks: 2 layers and a 32000-token vocabulary (the
# layers' shapes, the sequence and the layout are the plan's). Prints the search's best plans, the
# trimmed plan's prediction per GPU, and the run's iterations and the GPU's peak memory in use.
#   bench/long_context_one_gpu.sh MEGAPLAN_BINARY OUT_DIR
set -euo pipefail
megaplan=$1
out=$2
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
long=(--model llama3-8b --seq-length 131072 --max-position-embeddings 131072)
trim=(--num-layers 2 --vocab-size 32000)
"$megaplan" search "${long[@]}" --cluster dgx-h200 --gpus 8 --gbs 8 --top 5 --out "$out/plan.json" >"$out/search.txt"
# The token values do not change the work: the byte tokenizer over random words, 3 iterations of
# 8 sequences of 128 Ki tokens.
python3 "$(dirname "$0")/random_words_corpus.py" "$out/docs.jsonl" 1200 3000
"$megaplan" data prepare --input "$out/docs.jsonl" --output-prefix "$out/corpus" --append-eod >/dev/null
"$megaplan" simulate --plan "$out/plan.json" "${trim[@]}" >"$out/simulate.txt"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$out/memory.log" &
sampler=$!
"$megaplan" train --device cuda --plan "$out/plan.json" "${trim[@]}" --world-size 8 \
  --data-path "$out/corpus_text_document" --train-iters 3 --log-interval 1 >"$out/train.log" 2>&1
kill "$sampler"
sed -n '1,8p' "$out/search.txt"
sed -n '1,2p;/^memory /p' "$out/simulate.txt"
grep -E '^(training|iteration) ' "$out/train.log"
echo "GPU memory in use at its peak: $(sort -n "$out/memory.log" | tail -1) MiB"
