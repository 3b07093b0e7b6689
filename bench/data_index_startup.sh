#!/usr/bin/env bash
# Start-up of pretraining-sized runs on a small dataset: `megaplan train --train-samples N` to its
# first iteration (--exit-interval 1), once building the sample indexes (a fresh --data-cache-path)
# and once reusing them, timed with their peak resident memory; "indexes s" is the build's own
# time as the run logs it (training and validation index), "build CPU s" the whole build run's
# user and system time (what a busier machine stretches). Prints a table last.
#   bench/data_index_startup.sh MEGAPLAN_BINARY OUT_DIR [SAMPLES ...]
# SAMPLES default: 10000000 100000000 300000000. The dataset: 1000 documents of 200 to 1800 bytes
# (about a million tokens of the byte tokenizer), so that 300 M samples of 1025 tokens span some
# 300,000 epochs, each shuffled. OUT_DIR keeps the dataset, the caches and the logs.
set -euo pipefail
megaplan=$1
out=$2
shift 2
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(10000000 100000000 300000000)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"

python3 - "$out/docs.jsonl" <<'EOF'
import json, random, sys
words = "the of and to in is was for on that with as by at from his her an were are which this be or had".split()
random.seed(38)
with open(sys.argv[1], "w") as out:
    for _ in range(1000):
        length = random.randint(200, 1800)
        text = ""
        while len(text) < length:
            text += random.choice(words) + " "
        out.write(json.dumps({"text": text[:length]}) + "\n")
EOF
"$megaplan" data prepare --tokenizer byte --append-eod --input "$out/docs.jsonl" --output-prefix "$out/small" \
  > "$out/prepare.log"

# One run to its first iteration; prints "SECONDS RESIDENT_KB CPU_SECONDS" (GNU time).
run() {
  local cache=$1 samples=$2 log=$3
  /usr/bin/time -f "%e %M %U %S" -o "$log.time" "$megaplan" train --device cpu --model "$here/../examples/models/tiny-gpt.json" \
    --vocab-size 257 --seq-length 1024 --max-position-embeddings 1024 --mbs 1 --gbs 1 \
    --data-path "$out/small_text_document" --data-cache-path "$cache" --train-samples "$samples" \
    --log-interval 1 --exit-interval 1 > "$log" 2>&1
  awk '{ printf "%s %s %.1f\n", $1, $2, $3 + $4 }' "$log.time"
}

rows=()
for samples in "${counts[@]}"; do
  cache="$out/cache-$samples"
  rm -rf "$cache"
  read -r build_s build_kb build_cpu < <(run "$cache" "$samples" "$out/build-$samples.log")
  read -r reuse_s reuse_kb _ < <(run "$cache" "$samples" "$out/reuse-$samples.log")
  grep -q "^iteration 1/" "$out/reuse-$samples.log" || { echo "no first iteration: $out/reuse-$samples.log" >&2; exit 1; }
  epochs=$(grep -o '[0-9]* epoch(s) of the training split' "$out/build-$samples.log" | cut -d' ' -f1)
  indexes_s=$(grep -o '^built the index .* in [0-9.]* s' "$out/build-$samples.log" | awk '{ s += $(NF - 1) } END { print s }')
  cache_mb=$(du -sm "$cache" | cut -f1)
  rows+=("$(printf '%11s  %7s  %8s  %7s  %9s  %9s  %11s  %7s  %9s' "$samples" "$epochs" "$cache_mb" "$build_s" \
    "$((build_kb / 1024))" "$indexes_s" "$build_cpu" "$reuse_s" "$((reuse_kb / 1024))")")
done

echo "train --train-samples N to its first iteration, $(nproc) cores; build: a fresh --data-cache-path"
printf '%11s  %7s  %8s  %7s  %9s  %9s  %11s  %7s  %9s\n' samples epochs "cache MB" "build s" "build MB" "indexes s" \
  "build CPU s" "reuse s" "reuse MB"
printf '%s\n' "${rows[@]}"
