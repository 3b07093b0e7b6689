#!/usr/bin/env bash
# ThreadSanitizer over megaplan's threads: the threads-as-ranks runtime (a tp 2 x pp 2 x dp 2 CPU
# training run with sequence parallelism, the distributed optimizer and overlapped gradient
# reduction and parameter gathering, then a pp 2 zbv run that saves and resumes) and the
# planner's thread pool (a search on 4 threads). Builds only the `megaplan` binary, without CUDA,
# at -O1 with line tables (what TSan's reports need), its libraries as unity builds (as CI's
# sanitizer build), in MEGAPLAN_TSAN_BUILD_DIR (default build-tsan). Any report fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${MEGAPLAN_TSAN_BUILD_DIR:-$root/build-tsan}
"$root/scripts/setup.sh"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DMEGAPLAN_SANITIZE_THREAD=ON \
    -DMEGAPLAN_CUDA=OFF -DMEGAPLAN_BENCHMARKS=OFF -DCMAKE_UNITY_BUILD=ON >&2
fi
cmake --build "$build_dir" -j "${MEGAPLAN_JOBS:-2}" --target megaplan >&2
megaplan=$build_dir/cli/megaplan
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 ${TSAN_OPTIONS:-}"

run() {
  echo "tsan: megaplan $*" >&2
  "$megaplan" "$@" >"$scratch/out" 2>"$scratch/err" || {
    cat "$scratch/err" >&2
    echo "tsan: FAILED: megaplan $*" >&2
    exit 1
  }
}
python3 -c '
import random
random.seed(1)
words = ["the", "cat", "a", "dog", "sees", "runs", "small", "old", "bird", "home"]
for _ in range(40):
    print("{\"text\": \"%s\"}" % " ".join(random.choice(words) for _ in range(60)))' >"$scratch/docs.jsonl"
run data prepare --input "$scratch/docs.jsonl" --output-prefix "$scratch/corpus" --append-eod
tiny=(--device cpu --model "$root/examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --num-layers 4
  --data-path "$scratch/corpus_text_document" --split 9,1,0 --log-interval 1 --eval-interval 2 --eval-iters 1)
run train "${tiny[@]}" --world-size 8 --tp 2 --sequence-parallel --pp 2 --mbs 1 --gbs 8 --use-distributed-optimizer \
  --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 5000 --train-iters 3
run train "${tiny[@]}" --world-size 2 --pp 2 --vpp 2 --schedule zbv --mbs 1 --gbs 4 --train-iters 2 \
  --save "$scratch/ckpt" --save-interval 1
run train "${tiny[@]}" --world-size 2 --pp 2 --vpp 2 --schedule zbv --mbs 1 --gbs 4 --train-iters 3 \
  --load "$scratch/ckpt" --save "$scratch/ckpt"
run search --model gpt2-350m --cluster dgx-a100-80gb --gpus 64 --threads 4 --top 3
echo "tsan: no reports (threads-as-ranks training, checkpoints, the planner's pool)"
