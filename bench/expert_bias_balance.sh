#!/usr/bin/env bash
# The aux-loss-free expert bias balancing a real run, one GPU, one call (issue 40): bench/train_speed.sh's
# moe-2b (8 layers, hidden 2048, 8 SwiGLU experts of 4096, top 2, seq 4096) on the byte-level corpus
# of the device's Python sources, whose routing is far from balanced, 150 iterations of gbs 8 each:
# softmax routing with the switch loss at 0.01 (what the other MoE rows ran), sigmoid routing alone,
# and sigmoid routing with the expert bias at two rates. Prints the experts' load (the busiest
# expert's tokens over the mean, over the MoE layers, as train logs it; 1 is balanced, 4 the most)
# at iterations 10, 50, 100 and 150, and the last interval's tokens/s.
#   bench/expert_bias_balance.sh MEGAPLAN_BINARY OUT_DIR
set -u
m=$1; out=$2
mkdir -p "$out"
mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -300)
"$m" data prepare --tokenizer byte --append-eod --output-prefix "$out/corpus" --input "${files[@]}" > /dev/null 2>&1
model=(--model llama3-8b --num-layers 8 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32
  --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --num-experts 8
  --moe-ffn-hidden-size 4096 --moe-router-topk 2 --device cuda --mbs 1 --gbs 8 --train-iters 150
  --log-interval 10 --eval-iters 0 --lr 1e-4 --data-path "$out/corpus_text_document" --split 1,0,0)
declare -A runs=(
  [softmax-aux]="--moe-aux-loss-coeff 0.01"
  [sigmoid]="--moe-router-score-function sigmoid --moe-router-load-balancing-type none"
  [sigmoid-bias-1e-3]="--moe-router-score-function sigmoid --moe-router-load-balancing-type none --moe-router-enable-expert-bias"
  [sigmoid-bias-1e-2]="--moe-router-score-function sigmoid --moe-router-load-balancing-type none --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2")
printf '%-20s %8s %8s %8s %8s %12s\n' run "it 10" "it 50" "it 100" "it 150" "tokens/s"
for r in softmax-aux sigmoid sigmoid-bias-1e-3 sigmoid-bias-1e-2; do
  # shellcheck disable=SC2086
  "$m" train "${model[@]}" ${runs[$r]} > "$out/$r.txt" 2>&1
  load() { grep "^iteration $1/" "$out/$r.txt" | sed -n 's/.*tokens_per_expert_max_mean \([0-9.]*\).*/\1/p'; }
  speed=$(grep "^iteration 150/" "$out/$r.txt" | sed -n 's/.* | \([0-9.]*\) tokens\/s.*/\1/p')
  printf '%-20s %8s %8s %8s %8s %12s\n' "$r" "$(load 10)" "$(load 50)" "$(load 100)" "$(load 150)" "$speed"
  grep -m2 -i "error" "$out/$r.txt"
done
