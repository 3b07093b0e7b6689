#!/usr/bin/env bash
# The simulator against the executor on one GPU: each layout is trained with `train --trace`
# (the last iteration's measured timeline), simulated with `simulate --trace` on the matching
# cluster preset, and the two compared by `megaplan compare`. Single-GPU layouts show the
# simulator's error per action kind; the pp 2 layouts run both ranks as threads on the one GPU
# (the in-process communicator), so their times are not a 2-GPU run's, but their order of actions
# must be the simulated one. The multi-GPU layouts (a GPU count in the list's last field) run one
# process per GPU over NCCL under `megaplan launch` where that many GPUs are visible, and are
# simulated on the DGX preset cut to that many GPUs; their ranks' timelines are gathered by rank 0.
# Peak memory: the executor's allocator peak (the log's peak_memory_bytes, rank 0's) against the
# simulated peak of pipeline rank 0 less the runtime reserve, which lies outside that allocator.
# Prints each comparison, then a summary table (with the traced iteration's model TFLOP/s per GPU).
# Single-GPU layouts train for SUSTAIN_SECONDS (default 30) before the traced iteration: a GPU
# starting cool runs its first seconds above the clock it sustains once at its power limit and
# temperature (gpt-1.3b on the H100: 288 ms per iteration at first, 297 ms after 30 s), and a
# training run is the sustained state. The pp 2 layouts, which only check the order, train 6.
# With PROFILE the simulator costs kernels from that file (`megaplan profile --out`), else from
# the GPU's built-in profile. LAYOUTS (indices into the list below, e.g. "0 1 2") runs a part of
# the list, for device calls too short for all of it. A layout with experts is simulated again,
# after its training run, at the load that run logged (--moe-imbalance).
#   [SUSTAIN_SECONDS=S] [LAYOUTS="I ..."] bench/simulated_vs_measured.sh MEGAPLAN_BINARY OUT_DIR [h100|h200] [PROFILE]
set -uo pipefail
megaplan=$(realpath "$1")
out=$2
gpu=${3:-h100}
sustain=${SUSTAIN_SECONDS:-30}
profile=()
[ $# -ge 4 ] && profile=(--profile "$(realpath "$4")")
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0

corpus="$out/corpus"
mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -800)
"$megaplan" data prepare --tokenizer byte --append-eod --output-prefix "$corpus" --input "${files[@]}" > "$out/prepare.log" ||
  { echo "data prepare failed"; exit 1; }

# The Llama-style ~1B of bench/train_speed.sh (16 layers, hidden 2048, ffn 8192, 32 heads in 8
# query groups, Llama 3's vocabulary untied, seq 4096).
llama_1b="--model llama3-8b --num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 \
--num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256"
gpt13="--model gpt-1.3b --vocab-size 50257"
# An MoE of the Llama ~1B's attention: 8 layers, each 8 SwiGLU experts of width 4096, top 2, with
# the switch loss (about 2.3 B parameters, 0.8 B active).
moe="--model llama3-8b --num-layers 8 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 \
--num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 128256 --num-experts 8 \
--moe-ffn-hidden-size 4096 --moe-router-topk 2 --moe-aux-loss-coeff 0.01"
# Qwen3's attention (heads of 128, each query and key head normalised): a Qwen3-1.7B-shaped dense
# model (16 of its 28 layers, hidden 2048, ffn 6144, 16 heads in 8 groups, its vocabulary), and
# Qwen3-30B-A3B's layer (32 heads in 4 groups, 128 experts of 768, top 8 renormalised) 4 times.
qwen3="--model llama3-8b --num-layers 16 --hidden-size 2048 --ffn-hidden-size 6144 --num-attention-heads 16 \
--num-query-groups 8 --kv-channels 128 --qk-layernorm --norm-epsilon 1e-6 --seq-length 4096 --max-position-embeddings 4096 \
--vocab-size 151936"
qwen3_moe="--model qwen3-30b-a3b --num-layers 4 --seq-length 4096 --max-position-embeddings 4096 --vocab-size 151936 \
--moe-aux-loss-coeff 0.001"
# name | plan flags | cluster | GPUs (launched, one process each; absent: one process) — each with the
# vocabulary its model was published with (train would otherwise take the byte-level corpus's 257)
layouts=(
  "gpt2-124m mbs 4 gbs 32|--model gpt2-124m --vocab-size 50257 --mbs 4 --gbs 32|--cluster ${gpu}-x1"
  "gpt2-124m mbs 8 gbs 32|--model gpt2-124m --vocab-size 50257 --mbs 8 --gbs 32|--cluster ${gpu}-x1"
  "gpt2-124m mbs 16 gbs 32|--model gpt2-124m --vocab-size 50257 --mbs 16 --gbs 32|--cluster ${gpu}-x1"
  "gpt2-124m mbs 8 selective|--model gpt2-124m --vocab-size 50257 --mbs 8 --gbs 32 --recompute-granularity selective|--cluster ${gpu}-x1"
  "gpt2-350m mbs 4 gbs 16|--model gpt2-350m --vocab-size 50257 --mbs 4 --gbs 16|--cluster ${gpu}-x1"
  "gpt2-350m mbs 8 full|--model gpt2-350m --vocab-size 50257 --mbs 8 --gbs 16 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1|--cluster ${gpu}-x1"
  "gpt-1.3b mbs 1 gbs 8|--model gpt-1.3b --vocab-size 50257 --mbs 1 --gbs 8|--cluster ${gpu}-x1"
  "gpt-1.3b mbs 2 gbs 8|--model gpt-1.3b --vocab-size 50257 --mbs 2 --gbs 8|--cluster ${gpu}-x1"
  "gpt-1.3b mbs 4 selective|--model gpt-1.3b --vocab-size 50257 --mbs 4 --gbs 8 --recompute-granularity selective|--cluster ${gpu}-x1"
  "llama-1b mbs 1 gbs 8|$llama_1b --mbs 1 --gbs 8|--cluster ${gpu}-x1"
  "llama-1b mbs 2 selective|$llama_1b --mbs 2 --gbs 8 --recompute-granularity selective|--cluster ${gpu}-x1"
  "gpt2-124m pp 2 1f1b, one GPU|--model gpt2-124m --vocab-size 50257 --mbs 4 --gbs 32 --pp 2 --world-size 2|--cluster dgx-${gpu} --gpus 2"
  "gpt2-124m pp 2 dualpipev, one GPU|--model gpt2-124m --vocab-size 50257 --mbs 4 --gbs 32 --pp 2 --vpp 2 --schedule dualpipev --world-size 2|--cluster dgx-${gpu} --gpus 2"
  # 13 onwards: one process per GPU (issue 19's fidelity set).
  "gpt-1.3b dp 2|$gpt13 --mbs 4 --gbs 16 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b dp 2 distributed optimizer|$gpt13 --mbs 4 --gbs 16 --overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b tp 2 sp|$gpt13 --mbs 4 --gbs 8 --tp 2 --sequence-parallel|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b pp 2 1f1b|$gpt13 --mbs 4 --gbs 32 --pp 2|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b pp 2 interleaved|$gpt13 --mbs 4 --gbs 32 --pp 2 --vpp 2 --schedule interleaved|--cluster dgx-${gpu} --gpus 2|2"
  "llama-1b dp 2|$llama_1b --mbs 2 --gbs 8 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b tp 2 x dp 2 sp|$gpt13 --mbs 4 --gbs 16 --tp 2 --sequence-parallel --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 4|4"
  "gpt-1.3b pp 2 x dp 2|$gpt13 --mbs 4 --gbs 32 --pp 2 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 4|4"
  "gpt-1.3b tp 2 x pp 2|$gpt13 --mbs 4 --gbs 32 --tp 2 --pp 2 --sequence-parallel|--cluster dgx-${gpu} --gpus 4|4"
  "gpt-1.3b dp 4|$gpt13 --mbs 4 --gbs 32 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 4|4"
  "gpt-1.3b tp 4 sp|$gpt13 --mbs 4 --gbs 8 --tp 4 --sequence-parallel|--cluster dgx-${gpu} --gpus 4|4"
  # 24: one GPU's share of the gpt-1.3b dp layouts above (13, 22), alone.
  "gpt-1.3b mbs 4 gbs 8|--model gpt-1.3b --vocab-size 50257 --mbs 4 --gbs 8|--cluster ${gpu}-x1"
  # 25: one GPU's share of the Llama's dp 2 layout (18), alone.
  "llama-1b mbs 2 gbs 4|$llama_1b --mbs 2 --gbs 4|--cluster ${gpu}-x1"
  # 26 onwards: more of the two-GPU set.
  "gpt-1.3b pp 2 zbv|$gpt13 --mbs 4 --gbs 32 --pp 2 --vpp 2 --schedule zbv|--cluster dgx-${gpu} --gpus 2|2"
  "gpt-1.3b pp 2 dualpipev|$gpt13 --mbs 4 --gbs 32 --pp 2 --vpp 2 --schedule dualpipev|--cluster dgx-${gpu} --gpus 2|2"
  "llama-1b tp 2 sp|$llama_1b --mbs 2 --gbs 8 --tp 2 --sequence-parallel|--cluster dgx-${gpu} --gpus 2|2"
  # 29 onwards: Megatron's dropout (0.1 hidden and attention) on 2, 7 and 9's layouts.
  "gpt2-124m mbs 16 dropout|--model gpt2-124m --vocab-size 50257 --mbs 16 --gbs 32 --hidden-dropout 0.1 --attention-dropout 0.1|--cluster ${gpu}-x1"
  "gpt-1.3b mbs 2 dropout|--model gpt-1.3b --vocab-size 50257 --mbs 2 --gbs 8 --hidden-dropout 0.1 --attention-dropout 0.1|--cluster ${gpu}-x1"
  "llama-1b mbs 1 dropout|$llama_1b --mbs 1 --gbs 8 --hidden-dropout 0.1 --attention-dropout 0.1|--cluster ${gpu}-x1"
  # 32 onwards: issue 38's held-out widths, head dimension 64 at hidden sizes 1280 and 1600, between
  # the profile grid's 1024 and 2048 (never used to set anything).
  "gpt2-774m mbs 4 gbs 16|--model gpt2-774m --vocab-size 50257 --mbs 4 --gbs 16|--cluster ${gpu}-x1"
  "gpt2-1.5b mbs 2 gbs 8|--model gpt2-1.5b --vocab-size 50257 --mbs 2 --gbs 8|--cluster ${gpu}-x1"
  # 34 onwards: held out of the densified grid (widths 1280 and 1600, batch-heads at half octaves):
  # widths 1408 and 1792 at head dimension 64, 66 and 56 batch-heads, microbatches of 3 and 2 sequences
  # (3072 and 2048 tokens), and 2 GPUs as a pipeline of two.
  "gpt width 1408 mbs 3|--model gpt2-774m --vocab-size 50257 --hidden-size 1408 --num-attention-heads 22 --mbs 3 --gbs 12|--cluster ${gpu}-x1"
  "gpt width 1792 mbs 2|--model gpt2-1.5b --vocab-size 50257 --hidden-size 1792 --num-attention-heads 28 --mbs 2 --gbs 8|--cluster ${gpu}-x1"
  "gpt width 1792 pp 2|--model gpt2-1.5b --vocab-size 50257 --hidden-size 1792 --num-attention-heads 28 --mbs 2 --gbs 32 --pp 2|--cluster dgx-${gpu} --gpus 2|2"
  # 37 onwards: context parallelism (issue 39), the ring over NCCL; 40 and 41 are its speed target
  # (seq 32768 at cp 4 on four GPUs against seq 8192 without cp on one, model TFLOP/s per GPU).
  "llama-1b cp 2|$llama_1b --mbs 1 --gbs 8 --cp 2|--cluster dgx-${gpu} --gpus 2|2"
  "llama-1b tp 2 x cp 2 sp|$llama_1b --mbs 1 --gbs 8 --tp 2 --cp 2 --sequence-parallel|--cluster dgx-${gpu} --gpus 4|4"
  "llama-1b seq 16384 cp 4|$llama_1b --seq-length 16384 --max-position-embeddings 16384 --mbs 1 --gbs 4 --cp 4|--cluster dgx-${gpu} --gpus 4|4"
  "llama-1b seq 32768 cp 4|$llama_1b --seq-length 32768 --max-position-embeddings 32768 --mbs 1 --gbs 4 --cp 4|--cluster dgx-${gpu} --gpus 4|4"
  "llama-1b seq 8192|$llama_1b --seq-length 8192 --max-position-embeddings 8192 --mbs 1 --gbs 4|--cluster ${gpu}-x1"
  # 42, 43: the ring on two GPUs at 8192 and 16384 tokens per GPU (42 against 41 where no four GPUs are lent)
  "llama-1b seq 16384 cp 2|$llama_1b --seq-length 16384 --max-position-embeddings 16384 --mbs 1 --gbs 4 --cp 2|--cluster dgx-${gpu} --gpus 2|2"
  "llama-1b seq 32768 cp 2|$llama_1b --seq-length 32768 --max-position-embeddings 32768 --mbs 1 --gbs 4 --cp 2|--cluster dgx-${gpu} --gpus 2|2"
  # 44 onwards: mixtures of experts (issue 40), simulated at the load the training run logs.
  "moe 8x top 2 mbs 1|$moe --mbs 1 --gbs 8|--cluster ${gpu}-x1"
  "moe 8x top 2 mbs 2|$moe --mbs 2 --gbs 8|--cluster ${gpu}-x1"
  "moe 8x top 2 dp 2|$moe --mbs 1 --gbs 8 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 2|2"
  "moe 8x top 2 ep 2|$moe --mbs 1 --gbs 8 --ep 2 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 2|2"
  "moe 8x top 2 ep 4|$moe --mbs 1 --gbs 8 --ep 4 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 4|4"
  "moe 8x top 2 ep 2 x dp 2|$moe --mbs 1 --gbs 8 --ep 2 --overlap-grad-reduce --use-distributed-optimizer|--cluster dgx-${gpu} --gpus 4|4"
  "moe 8x top 2 tp 2 sp|$moe --mbs 1 --gbs 8 --tp 2 --sequence-parallel|--cluster dgx-${gpu} --gpus 2|2"
  "moe 8x top 2 tp 2 sp x ep 2|$moe --mbs 1 --gbs 8 --tp 2 --sequence-parallel --ep 2 --overlap-grad-reduce|--cluster dgx-${gpu} --gpus 4|4"
  # 52, 53: Qwen3's query and key norms, dense and with Qwen3-MoE's 128 experts.
  "qwen3 dense mbs 2|$qwen3 --mbs 2 --gbs 8|--cluster ${gpu}-x1"
  "qwen3-moe 128x top 8 mbs 1|$qwen3_moe --mbs 1 --gbs 8|--cluster ${gpu}-x1"
  # 54: full recomputation of the MoE layers (their forward again in each backward), held out.
  "moe 8x top 2 mbs 2 full recompute|$moe --mbs 2 --gbs 8 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1|--cluster ${gpu}-x1"
  # 55, 56: MoE layers under a split backward (I, then W), the order of actions on one GPU.
  "moe pp 2 zb-h1, one GPU|$moe --mbs 1 --gbs 8 --pp 2 --schedule zb-h1 --world-size 2|--cluster dgx-${gpu} --gpus 2"
  "moe pp 2 dualpipev, one GPU|$moe --mbs 1 --gbs 8 --pp 2 --vpp 2 --schedule dualpipev --world-size 2|--cluster dgx-${gpu} --gpus 2"
  # 57, 58: the experts cut over an etp group of 4 across two replicas' tp pairs, and over pairs of
  # a tp group of 4; the four ranks on one GPU.
  "moe tp 2 x dp 2 etp 4, one GPU|$moe --mbs 1 --gbs 8 --tp 2 --sequence-parallel --etp 4 --world-size 4|--cluster dgx-${gpu} --gpus 4"
  "moe tp 4 etp 2, one GPU|$moe --mbs 1 --gbs 8 --tp 4 --sequence-parallel --etp 2 --world-size 4|--cluster dgx-${gpu} --gpus 4"
)
visible=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
rows=()
for i in ${LAYOUTS:-${!layouts[@]}}; do
  IFS='|' read -r name plan cluster gpus <<< "${layouts[$i]}"
  simulated=${plan/--world-size [0-9]/}  # one GPU running every rank: simulated on the cluster's GPUs
  launch=()
  if [ -n "$gpus" ]; then
    [ "$gpus" -le "$visible" ] || { echo "skipped $name: $gpus GPUs, $visible visible"; continue; }
    launch=(launch --nproc-per-node "$gpus" --)
  fi
  # shellcheck disable=SC2086
  "$megaplan" simulate $simulated $cluster "${profile[@]}" --trace "$out/simulated-$i.json" > "$out/simulate-$i.txt" 2>&1 ||
    { echo "simulate failed for $name:"; tail -3 "$out/simulate-$i.txt"; continue; }
  # shellcheck disable=SC2086
  "$megaplan" simulate $simulated $cluster "${profile[@]}" --json > "$out/simulate-$i.json" 2>&1 ||
    { echo "simulate --json failed for $name"; continue; }
  iterations=6
  if [[ $plan != *--world-size* ]]; then
    # Launched layouts and one-GPU layouts alike train to their sustained clocks.
    iterations=$(python3 -c "import json, math, sys; t = json.load(open(sys.argv[1]))['iteration_time_s']; print(max(6, math.ceil(float(sys.argv[2]) / t)))" \
      "$out/simulate-$i.json" "$sustain")
  fi
  # shellcheck disable=SC2086
  "$megaplan" "${launch[@]}" train $plan --device cuda --data-path "${corpus}_text_document" --split 1,0,0 --train-iters "$iterations" \
    --log-interval "$iterations" --eval-iters 0 --lr 1e-4 --trace "$out/measured-$i.json" --log-file "$out/log-$i.jsonl" \
    > "$out/train-$i.txt" 2>&1 || { echo "train failed for $name:"; tail -3 "$out/train-$i.txt"; continue; }
  if grep -q tokens_per_expert_max_mean "$out/log-$i.jsonl"; then  # a model with experts (flags or preset)
    # Simulated again at the load the run logged (the busiest expert's rows over the mean, averaged
    # over the MoE layers), as a user states it.
    imbalance=$(python3 -c "import json, sys; r = [json.loads(l) for l in open(sys.argv[1]) if 'tokens_per_expert_max_mean' in l]; print(round(max(1.0, r[-1]['tokens_per_expert_max_mean']), 3))" \
      "$out/log-$i.jsonl")
    # shellcheck disable=SC2086
    "$megaplan" simulate $simulated $cluster "${profile[@]}" --moe-imbalance "$imbalance" --trace "$out/simulated-$i.json" \
      > "$out/simulate-$i.txt" 2>&1 && "$megaplan" simulate $simulated $cluster "${profile[@]}" --moe-imbalance "$imbalance" \
      --json > "$out/simulate-$i.json" 2>&1 || { echo "simulate at imbalance $imbalance failed for $name"; continue; }
    name="$name (imbalance $imbalance)"
  fi
  memory=$(python3 - "$out/log-$i.jsonl" "$out/simulate-$i.json" <<'PY'
import json, sys
measured = max(json.loads(line)["peak_memory_bytes"] for line in open(sys.argv[1]) if "peak_memory_bytes" in line)
# The log is rank 0's (its backend's allocator, also where one process runs every rank), and
# simulate lists the pipeline ranks in order.
rank0 = json.load(open(sys.argv[2]))["stages"][0]
predicted = rank0["peak_memory_bytes"] - rank0["runtime_reserve_bytes"]
print(f"{predicted / 2**30:.3f} {measured / 2**30:.3f} {100 * (predicted - measured) / measured:+.2f}%")
PY
)
  "$megaplan" compare --simulated "$out/simulated-$i.json" --measured "$out/measured-$i.json" > "$out/compare-$i.txt" 2>&1 ||
    { echo "compare failed for $name:"; tail -3 "$out/compare-$i.txt"; continue; }
  echo "== $name ($iterations iterations)"
  cat "$out/compare-$i.txt"
  iteration=$(grep '^iteration' "$out/compare-$i.txt" | sed 's/^iteration *//')
  tflops=$(python3 - "$out/simulate-$i.json" "$out/compare-$i.txt" <<'PY'
import json, re, sys
simulated = json.load(open(sys.argv[1]))
measured_ms = float(re.search(r"([\d.]+) ms measured", open(sys.argv[2]).read()).group(1))
# The traced iteration's model TFLOP/s per GPU: the simulated iteration's FLOPs in the measured time.
print(f"{simulated['model_tflops_per_gpu'] * simulated['iteration_time_s'] * 1e3 / measured_ms:.1f}")
PY
)
  order=$(grep -q 'every rank computed in the simulated order' "$out/compare-$i.txt" && echo same || echo differs)
  rows+=("$name|$iteration|$order|$memory|$tflops")
done
echo
printf '%-36s %-60s %-8s %-36s %s\n' layout "iteration (simulated, measured: error)" order "peak GiB (predicted measured error)" \
  "model TFLOP/s per GPU"
for row in "${rows[@]}"; do
  IFS='|' read -r name iteration order memory tflops <<< "$row"
  printf '%-36s %-60s %-8s %-36s %s\n' "$name" "$iteration" "$order" "$memory" "$tflops"
done
