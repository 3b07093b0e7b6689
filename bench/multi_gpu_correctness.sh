#!/usr/bin/env bash
# Multi-GPU correctness on real NCCL, one process per GPU: a small Llama (8 layers, hidden
# 512, 8 heads in 4 query groups, SwiGLU, RMSNorm, RoPE, untied, vocabulary 32,000, seq 1024, mbs 2,
# gbs 16) trained 20 iterations in every layout the visible GPUs allow, each started by `megaplan
# launch`, against
#   - the single-GPU run (world 1): every loss and every final weight (the checkpoints converted to
#     Hugging Face tensors by `megaplan convert`) within the one-GPU emulation tests' bf16 bounds
#     (tests/executor/train/one_gpu_parallel_training_test.cc: first loss 1e-5, 1e-4 under tensor
#     parallelism; every loss 2e-3; pipelines 1e-5 throughout; the final weights, the largest
#     relative L2 difference of any tensor, 1e-5 for pipelines, 1e-2 for dp, 2e-2 for tp: the
#     reasons are in bench/multi_gpu_compare.py), and
#   - the same layout emulated on one GPU (its ranks as threads sharing GPU 0), whose losses NCCL
#     repeats bit for bit where its sums see the same order (any two ranks; pipelines always).
#     A layout of more ranks than visible GPUs runs as that emulation alone, against the single run.
# Then: the same 4- (or 2-) GPU run under mpirun and torchrun, bit for bit; a run stopped halfway
# by --exit-interval and resumed, bit for bit; that checkpoint loaded into other
# layouts (reshard on load) within the bounds; and kill -9 of one rank mid-iteration under each
# launcher: how long the others took to end, their last words, and whether any process is left.
# Prints tables last.
# With MOE=1 the model's MLPs are mixtures of 8 SwiGLU experts of width 768, each token to its top 2
# with the load-balancing loss (Mixtral's layer), and the layouts are expert parallelism's; the
# tail (launchers, resume, reshard, kills) runs on ep 2 x dp 2 (ep 2 on two GPUs).
#   [SCRATCH=DIR] [ONLY="LAYOUT ..."] [LAYOUTS_ONLY=1] [MOE=1] bench/multi_gpu_correctness.sh MEGAPLAN_BINARY OUT_DIR
# ONLY runs those layouts of the list below (and everything after the list), e.g. ONLY="tp4 dp4";
# LAYOUTS_ONLY=1 skips what follows the list (launchers, resume, reshard, kills).
# Checkpoints and their Hugging Face copies (about 1 GB each) go under SCRATCH (default OUT_DIR).
set -uo pipefail
megaplan=$(realpath "$1")
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
scratch=${SCRATCH:-$out}
mkdir -p "$scratch"
export NCCL_NVLS_ENABLE=0  # NVLink SHARP multicast stays off on our machines
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')

mapfile -t files < <(find /usr/lib/python3* -name '*.py' -size +4k 2>/dev/null | sort | head -300)
"$megaplan" data prepare --tokenizer byte --append-eod --output-prefix "$out/corpus" --input "${files[@]}" \
  > "$out/prepare.log" 2>&1 || { echo "data prepare failed:"; tail -3 "$out/prepare.log"; exit 1; }
model=(--model llama3-8b --num-layers 8 --hidden-size 512 --ffn-hidden-size 1536 --num-attention-heads 8
       --num-query-groups 4 --seq-length 1024 --max-position-embeddings 1024 --vocab-size 32000
       --make-vocab-size-divisible-by 32)  # 32,000 rows at every tp up to 8: one model in every layout
moe=${MOE:-0}
iterations=20
if [ "$moe" = 1 ]; then
  model+=(--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 768 --moe-aux-loss-coeff 0.01)
  # 8 iterations, as the one-GPU emulation tests hold MoE layouts: from about the 8th on the
  # routers' choices flip on bf16 rounding (a token goes to another expert) and every layout leaves
  # the single run alike, data parallelism too (measured 2026-11-30, 20 iterations on two H200s:
  # dp 2 and ep 2 both within 1.2e-4 of it to iteration 7, then up to 1.5e-2 and 1.3e-2).
  iterations=8
fi
common=(train --device cuda "${model[@]}" --mbs 2 --gbs 16 --data-path "$out/corpus_text_document" --split 1,0,0
        --train-iters "$iterations" --lr-decay-iters "$iterations" --lr 1e-3 --lr-warmup-iters 2 --eval-iters 0
        --log-interval 1 --distributed-timeout-minutes 1)

# go NAME WORLD LAUNCHER... -- FLAGS...: trains as NAME (log NAME.jsonl, output NAME.txt); LAUNCHER is
# "launch", "mpirun", "torchrun" or "threads" (one process, the ranks sharing GPU 0).
go() {
  local name=$1 world=$2 launcher=$3
  shift 3
  [ "$1" = "--" ] && shift
  local start=()
  case $launcher in
    launch) start=("$megaplan" launch --nproc-per-node "$world" --) ;;
    mpirun) start=(mpirun --allow-run-as-root -np "$world" -x NCCL_NVLS_ENABLE=0 "$megaplan") ;;
    torchrun) start=(torchrun --nproc-per-node "$world" --master-port 29611 --no-python "$megaplan") ;;
    threads) start=("$megaplan"); [ "$world" -gt 1 ] && set -- --world-size "$world" "$@" ;;
  esac
  rm -f "$out/$name.jsonl"
  timeout 120 "${start[@]}" "${common[@]}" "$@" --log-file "$out/$name.jsonl" > "$out/$name.txt" 2>&1
  echo "$name $?" >> "$out/codes"
}
rm -f "$out/codes"
rm -rf "$scratch/ckpt" "$scratch/hf"
mkdir -p "$scratch/ckpt" "$scratch/hf"

go single 1 threads -- --save "$scratch/ckpt/single" --save-interval "$iterations"
# name | GPUs | layout flags | tp: tensor parallelism's partial sums or the ring's merges in bf16 (the
# looser first-loss bound, as tests/executor/train/one_gpu_parallel_training_test.cc holds cp to)
layouts=(
  "tp2|2|--tp 2|tp" "tp2-sp|2|--tp 2 --sequence-parallel|tp"
  "pp2-1f1b|2|--pp 2|pp" "pp2-interleaved|2|--pp 2 --vpp 2 --schedule interleaved|pp"
  "pp2-zbv|2|--pp 2 --schedule zbv|pp" "pp2-dualpipev|2|--pp 2 --schedule dualpipev|pp"
  "dp2|2||dp" "dp2-distopt|2|--use-distributed-optimizer|dp"
  "tp2xpp2|4|--tp 2 --pp 2|tp" "tp2xdp2-sp-distopt|4|--tp 2 --sequence-parallel --use-distributed-optimizer|tp"
  "pp2xdp2-distopt|4|--pp 2 --use-distributed-optimizer|dp" "tp4|4|--tp 4|tp" "dp4|4||dp"
  "cp2|2|--cp 2|tp" "cp4|4|--cp 4|tp" "tp2xcp2-sp|4|--tp 2 --cp 2 --sequence-parallel|tp"
  "tp2xpp2xdp2|8|--tp 2 --pp 2 --use-distributed-optimizer --sequence-parallel|tp" "tp4xpp2|8|--tp 4 --pp 2|tp"
)
# Expert parallelism's all-to-alls move rows without arithmetic: data parallelism's bounds, but
# for the weights (multi_gpu_compare.py's "moe").
[ "$moe" = 1 ] && layouts=(
  "pp2-1f1b|2|--pp 2|pp" "dp2|2||moe" "ep2|2|--ep 2|moe" "ep2-distopt|2|--ep 2 --use-distributed-optimizer|moe"
  "ep4|4|--ep 4|moe" "ep2xdp2-distopt|4|--ep 2 --use-distributed-optimizer|moe" "ep2xpp2|4|--ep 2 --pp 2|moe"
)
rows=()
for entry in "${layouts[@]}"; do
  IFS='|' read -r name world flags kind <<< "$entry"
  [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $name "* ]] || continue
  if [ "$world" -gt "$gpus" ]; then
    # More ranks than GPUs: the one-GPU emulation alone, held to the single-GPU run as the
    # launched layouts are (its own row, NAME-threads).
    # shellcheck disable=SC2086
    go "$name-threads" "$world" threads -- $flags --save "$scratch/ckpt/$name-threads" --save-interval "$iterations"
    rows+=("$name-threads $world $kind")
    continue
  fi
  # shellcheck disable=SC2086
  go "$name" "$world" launch -- $flags --save "$scratch/ckpt/$name" --save-interval "$iterations"
  # shellcheck disable=SC2086
  go "$name-threads" "$world" threads -- $flags
  rows+=("$name $world $kind")
done
for name in single "${rows[@]%% *}"; do
  rm -rf "$scratch/hf/$name"
  "$megaplan" convert --to hf --load "$scratch/ckpt/$name" --save "$scratch/hf/$name" > "$out/convert-$name.txt" 2>&1 ||
    echo "convert failed for $name: $(tail -1 "$out/convert-$name.txt")"
done

# Launchers, resume and reshard on the largest layout of at most 4 GPUs.
big=tp2xpp2; big_flags=(--tp 2 --pp 2); big_world=4
if [ "$gpus" -lt 4 ]; then big=tp2; big_flags=(--tp 2); big_world=2; fi
if [ "$moe" = 1 ]; then
  big=ep2xdp2-distopt; big_flags=(--ep 2 --use-distributed-optimizer); big_world=4
  if [ "$gpus" -lt 4 ]; then big=ep2-distopt; big_world=2; fi
fi
tail_checks=$([ "${LAYOUTS_ONLY:-0}" = 1 ] && echo 0 || echo "$gpus")
if [ "$tail_checks" -ge 2 ]; then
  # The launched run the others are held to (ONLY may have left it out above).
  grep -q "^$big " "$out/codes" || go "$big" "$big_world" launch -- "${big_flags[@]}"
  go "$big-mpirun" "$big_world" mpirun -- "${big_flags[@]}"
  go "$big-torchrun" "$big_world" torchrun -- "${big_flags[@]}"
  rm -rf "$scratch/ckpt/resume"
  half=$((iterations / 2))
  go "$big-first-half" "$big_world" launch -- "${big_flags[@]}" --save "$scratch/ckpt/resume" --save-interval "$half" \
    --exit-interval "$half"
  go "$big-resumed" "$big_world" launch -- "${big_flags[@]}" --load "$scratch/ckpt/resume"
  # The same checkpoint into other layouts, and into one GPU.
  go "reshard-single" 1 threads -- --load "$scratch/ckpt/resume"
  go "reshard-dp2" 2 launch -- --load "$scratch/ckpt/resume"
  [ "$gpus" -ge 4 ] && go "reshard-pp2xdp2" 4 launch -- --pp 2 --load "$scratch/ckpt/resume"
fi

# kill -9 of rank 1 mid-iteration: the others must end with a reason, within the 1-minute timeout
# (--distributed-timeout-minutes 1); "none" starts the two ranks without a supervising launcher.
kill_test() {
  local launcher=$1 log="$out/kill-$1.txt"
  local start=()
  case $launcher in
    launch) start=("$megaplan" launch --nproc-per-node 2 --) ;;
    mpirun) start=(mpirun --allow-run-as-root -np 2 -x NCCL_NVLS_ENABLE=0 "$megaplan") ;;
    torchrun) start=(torchrun --nproc-per-node 2 --master-port 29621 --no-python "$megaplan") ;;
  esac
  local supervisor
  if [ "$launcher" = none ]; then
    # Two ranks started by hand as two nodes' launchers would (no supervisor to stop the survivor):
    # only the watchdog's timeout can end rank 0.
    for rank in 1 0; do
      RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29641 \
        "$megaplan" "${common[@]}" --train-iters 100000 --lr-decay-iters 100000 --log-interval 5 \
        > "$log.$rank" 2>&1 &
      [ "$rank" = 0 ] && supervisor=$!
    done
    ln -sf "$log.0" "$log"
  else
    "${start[@]}" "${common[@]}" --train-iters 100000 --lr-decay-iters 100000 --log-interval 5 > "$log" 2>&1 &
    supervisor=$!
  fi
  # Wait for training to be under way (a few log lines), then kill rank 1 where it stands.
  for _ in $(seq 120); do [ "$(grep -c '^iteration' "$log")" -ge 3 ] && break; sleep 1; done
  local victim=""
  for pid in $(pgrep -f "train --device cuda"); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qE '^(RANK|OMPI_COMM_WORLD_RANK)=1$'; then victim=$pid; fi
  done
  local t0; t0=$(date +%s.%N)
  [ -n "$victim" ] && kill -9 "$victim"
  timeout 150 tail --pid="$supervisor" -f /dev/null
  wait "$supervisor"; local status=$?
  local seconds; seconds=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  sleep 2
  local left; left=$(pgrep -fc "train --device cuda" || true)
  echo "kill|$launcher|${victim:-none}|$status|$seconds|$left|$(grep -iE 'error|rank [0-9]|signal|timed out' "$log" | grep -vE '^(iteration|training) ' | tail -2 | tr '\n' ' ' | cut -c1-240)" >> "$out/kills"
  pkill -9 -f "train --device cuda" 2> /dev/null || true
}
rm -f "$out/kills"
if [ "$tail_checks" -ge 2 ]; then
  kill_test launch
  kill_test mpirun
  kill_test torchrun
  kill_test none
fi

python3 "$here/multi_gpu_compare.py" "$out" "$scratch/hf" "$big" "${rows[@]}"
status=$?
if [ -f "$out/kills" ]; then
  echo; echo "kill -9 of rank 1 | launcher | victim | exit status | seconds to end | processes left | last words"
  cat "$out/kills"
fi
exit "$status"
