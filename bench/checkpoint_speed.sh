#!/usr/bin/env bash
# Checkpoint speed (issue 38): two `megaplan train` iterations that each save (--save-interval 1),
# then a run that loads the checkpoint (--load) and trains one more iteration, for each mode
# (synchronous, --async-save) and each thread count (--checkpoint-threads). Prints a table last:
# the checkpoint's size on disk; the first save's seconds (which also fault in the host image a
# run keeps) and the second's, with its GB/s, as the run logs them (synchronous: the training's
# whole pause; --async-save: the background write, with the training's pause for the snapshot
# beside it); the load's seconds and GB/s. The page cache is dropped before each load where this
# user may (root outside a container), so that the load reads the disk; the table says which.
#   bench/checkpoint_speed.sh MEGAPLAN_BINARY OUT_DIR DEVICE MODEL_FLAGS [THREADS ...]
# DEVICE is cpu or cuda; MODEL_FLAGS the model's flags in one word ("--model gpt-1.3b"; a preset's
# sequence length is kept, so give a short --seq-length on the CPU). THREADS default: 1 2 4 8.
# OUT_DIR holds the corpus, the logs and one checkpoint at a time (the size of the model's), e.g.
#   bench/checkpoint_speed.sh build/cli/megaplan /tmp/ckpt cuda "--model gpt-1.3b --seq-length 1024"
set -euo pipefail
megaplan=$1
out=$2
device=$3
model_flags=$4
shift 4
threads_list=("$@")
[ ${#threads_list[@]} -gt 0 ] || threads_list=(1 2 4 8)
mkdir -p "$out"

# A corpus for the data loader: the token values change nothing measured here.
python3 - "$out/docs.jsonl" <<'PY'
import json, random, sys
words = "the of and to in is was for on that with as by at from his her an were are which this be or had".split()
random.seed(38)
with open(sys.argv[1], "w") as out:
    for _ in range(200):
        out.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(400))}) + "\n")
PY
"$megaplan" data prepare --tokenizer byte --append-eod --input "$out/docs.jsonl" --output-prefix "$out/corpus" \
  > "$out/prepare.log"

drop_cache() {
  sync
  if (echo 3 > /proc/sys/vm/drop_caches) 2> /dev/null; then echo cold; else echo warm; fi
}

rows=()
for mode in sync async; do
  for threads in "${threads_list[@]}"; do
    name="$mode-$threads"
    checkpoint="$out/checkpoint"
    rm -rf "$checkpoint"
    flags=(--device "$device" --data-path "$out/corpus_text_document" --split 1,0,0 --mbs 1 --gbs 1 --eval-iters 0
      --log-interval 1 --checkpoint-threads "$threads")
    save_flags=(--save "$checkpoint" --save-interval 1)
    [ "$mode" = async ] && save_flags+=(--async-save)
    # shellcheck disable=SC2086  # the model's flags split on purpose
    "$megaplan" train $model_flags "${flags[@]}" --train-iters 2 "${save_flags[@]}" \
      > "$out/$name.save.txt" 2>&1 || { echo "the save run failed ($name):"; tail -3 "$out/$name.save.txt"; continue; }
    bytes=$(du -sb "$checkpoint/iter_0000002" | cut -f1)
    cache=$(drop_cache)
    # shellcheck disable=SC2086
    "$megaplan" train $model_flags "${flags[@]}" --train-iters 3 --load "$checkpoint" \
      > "$out/$name.load.txt" 2>&1 || { echo "the load run failed ($name):"; tail -3 "$out/$name.load.txt"; continue; }
    rows+=("$name $bytes $cache")
  done
done
rm -rf "$out/checkpoint"

python3 - "$out" "${rows[@]}" <<'PY'
import re, sys
out = sys.argv[1]
print(f"{'mode':<6}{'threads':>8}{'GB':>7} | {'1st save s':>10}{'save s':>8}{'GB/s':>7}{'pause s':>8} | "
      f"{'load s':>7}{'GB/s':>7} cache")
for row in sys.argv[2:]:
    name, size, cache = row.split()
    mode, threads = name.split("-")
    gigabytes = int(size) / 1e9
    save = open(f"{out}/{name}.save.txt").read()
    load = open(f"{out}/{name}.load.txt").read()
    saves = [float(s) for s in re.findall(r"^checkpoint save: \S+ GB in (\S+) s", save, re.M)]
    pauses = [float(s) for s in re.findall(r"training paused (\S+) s for the snapshot", save)]
    loaded = re.search(r"^checkpoint load: (\S+) s", load, re.M)
    first, last = (saves[0], saves[-1]) if saves else (float("nan"), float("nan"))
    pause = pauses[-1] if pauses else last
    load_s = float(loaded.group(1)) if loaded else float("nan")
    print(f"{mode:<6}{threads:>8}{gigabytes:>7.2f} | {first:>10.2f}{last:>8.2f}{gigabytes / last:>7.2f}{pause:>8.2f} | "
          f"{load_s:>7.2f}{gigabytes / load_s:>7.2f} {cache}")
PY
