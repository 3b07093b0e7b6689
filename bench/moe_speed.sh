#!/usr/bin/env bash
# Mixture-of-experts speed on two GPUs, one call: Mixtral-8x7B's layer shape cut to 4 layers and
# hidden 2048 (8 experts of 5632, top 2, seq 2048) on one GPU, then data parallelism and expert
# parallelism (with and without the distributed optimizer) over two, each GPU with mbs 4; prints
# iterations 20 and 30 of each (tokens/s, model TFLOP/s per GPU, the experts' load max/mean).
#   bench/moe_speed.sh MEGAPLAN_BINARY OUT_DIR
set -u
export NCCL_NVLS_ENABLE=0  # NVLink SHARP multicast stays off on our machines
m=$1; out=$2
mkdir -p "$out"
mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -300)
"$m" data prepare --tokenizer byte --append-eod --output-prefix "$out/corpus" --input "${files[@]}" > /dev/null 2>&1
model=(--model mixtral-8x7b --num-layers 4 --hidden-size 2048 --moe-ffn-hidden-size 5632 --num-attention-heads 16
  --num-query-groups 8 --seq-length 2048 --max-position-embeddings 2048 --vocab-size 32000 --device cuda --mbs 4
  --train-iters 30 --log-interval 10 --eval-iters 0 --lr 1e-4 --moe-aux-loss-coeff 0.01
  --data-path "$out/corpus_text_document" --split 1,0,0)
"$m" train "${model[@]}" --gbs 4 > "$out/single.txt" 2>&1
"$m" launch --nproc-per-node 2 -- train "${model[@]}" --gbs 8 > "$out/dp2.txt" 2>&1
"$m" launch --nproc-per-node 2 -- train "${model[@]}" --gbs 8 --ep 2 > "$out/ep2.txt" 2>&1
"$m" launch --nproc-per-node 2 -- train "${model[@]}" --gbs 8 --ep 2 --use-distributed-optimizer > "$out/ep2-distopt.txt" 2>&1
for r in single dp2 ep2 ep2-distopt; do echo "== $r"; grep "^iteration [23]0/" "$out/$r.txt" | sed 's/ | lr.*grad norm [0-9.e+-]* | / | /; s/ | ETA.*| tokens_per/ | tokens_per/'; grep -m2 -i "error" "$out/$r.txt"; done
