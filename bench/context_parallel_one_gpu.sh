#!/usr/bin/env bash
# The ring's cost on one GPU (context parallelism, issue 39): gpt-1.3b trained on the same two
# sequences an iteration at cp 1, 2 and 4, the cp ranks as threads sharing the GPU, so that the
# GPU does the same model work plus what the ring adds (its blocks at chunk length, smaller
# GEMMs, the exchange, here a copy on one GPU). Prints tokens/s of the last two iterations.
#   bench/context_parallel_one_gpu.sh MEGAPLAN_BINARY OUT_DIR [SEQ ...]   (default 8192 16384 32768)
set -euo pipefail
megaplan=$1
out=$2
shift 2
seqs=("$@")
[ ${#seqs[@]} -gt 0 ] || seqs=(8192 16384 32768)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# The token values do not change the work: the byte tokenizer over random words.
python3 "$(dirname "$0")/random_words_corpus.py" "$out/docs.jsonl" 400 3000
"$megaplan" data prepare --input "$out/docs.jsonl" --output-prefix "$out/corpus" --append-eod >/dev/null
printf '%-7s %-4s %s\n' seq cp "tokens/s (iterations 5, 6)"
for seq in "${seqs[@]}"; do
  for cp in 1 2 4; do
    log="$out/seq$seq-cp$cp.log"
    "$megaplan" train --device cuda --model gpt-1.3b --seq-length "$seq" --max-position-embeddings "$seq" \
      --world-size "$cp" --cp "$cp" --mbs 1 --gbs 2 --data-path "$out/corpus_text_document" --train-iters 6 \
      --log-interval 1 >"$log" 2>&1
    printf '%-7s %-4s %s\n' "$seq" "$cp" "$(grep -o '[0-9.]* tokens/s' <(grep '^iteration [56]/6' "$log") | tr '\n' ' ')"
  done
done
