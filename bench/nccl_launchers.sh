#!/usr/bin/env bash
# One process per GPU over NCCL, started by each launcher: a tiny GPT trained by `megaplan launch
# --nproc-per-node 1`, `mpirun -np 1` and `torchrun --no-python` (where PyTorch is installed), and,
# where two GPUs are visible, dp 2, pp 2 and tp 2 (with and without sequence parallelism) by
# `megaplan launch --nproc-per-node 2` and dp 2 by torchrun. Each launched run is compared with the same layout trained in
# one process (its ranks as threads sharing GPU 0), whose arithmetic it must repeat: a pipeline moves
# the same bytes, and a sum of two ranks' values is the same in either order. Prints a table last.
#   bench/nccl_launchers.sh MEGAPLAN_BINARY OUT_DIR
set -uo pipefail
megaplan=$(realpath "$1")
out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0  # NVLink SHARP multicast stays off on our machines

# A corpus of short sentences, byte-tokenized; the heads have dimension 64, as the flash attention
# kernels take.
python3 - "$out/corpus.jsonl" <<'PY'
import json, random, sys
random.seed(3)
words = ["the cat", "a dog", "my friend", "sat on", "ran to", "looked at", "the mat", "the park", "a red car"]
with open(sys.argv[1], "w") as f:
    for _ in range(200):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(60)) + "."}) + "\n")
PY
"$megaplan" data prepare --input "$out/corpus.jsonl" --output-prefix "$out/corpus" --append-eod > "$out/prepare.log" || {
  echo "data prepare failed:"; cat "$out/prepare.log"; exit 1; }
common=(train --device cuda --model "$here/../examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 64
        --num-layers 4 --hidden-size 128 --num-attention-heads 2 --mbs 2 --gbs 8 --data-path "$out/corpus_text_document"
        --split 1,0,0 --train-iters 20 --eval-iters 0 --log-interval 1 --lr 3e-3 --distributed-timeout-minutes 1)

rows=()
# run NAME LAYOUT_FLAGS... -- COMMAND...: runs COMMAND (bounded), logging to OUT_DIR/NAME.*.
run() {
  local name=$1
  shift
  local flags=()
  while [ "$1" != "--" ]; do flags+=("$1"); shift; done
  shift
  rm -f "$out/$name.jsonl"
  timeout 600 "$@" "${common[@]}" "${flags[@]}" --log-file "$out/$name.jsonl" > "$out/$name.txt" 2>&1
  echo "$name $?" >> "$out/codes"
}

rm -f "$out/codes"
run reference-1 -- "$megaplan"
run launch-1 -- "$megaplan" launch --nproc-per-node 1 --
if command -v mpirun > /dev/null; then
  run mpirun-1 -- mpirun --allow-run-as-root -np 1 -x NCCL_NVLS_ENABLE=0 "$megaplan"
else
  echo "mpirun-1 not-installed" >> "$out/codes"
fi
if command -v torchrun > /dev/null; then
  run torchrun-1 -- torchrun --nproc-per-node 1 --no-python "$megaplan"
else
  echo "torchrun-1 not-installed" >> "$out/codes"
fi
rows+=("megaplan-launch 1 dp1 launch-1 reference-1" "mpirun 1 dp1 mpirun-1 reference-1"
       "torchrun 1 dp1 torchrun-1 reference-1")
gpus=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
if [ "$gpus" -ge 2 ]; then
  run reference-dp2 --world-size 2 -- "$megaplan"
  run launch-dp2 -- "$megaplan" launch --nproc-per-node 2 --
  run reference-pp2 --world-size 2 --pp 2 -- "$megaplan"
  run launch-pp2 --pp 2 -- "$megaplan" launch --nproc-per-node 2 --
  run reference-tp2 --world-size 2 --tp 2 -- "$megaplan"
  run launch-tp2 --tp 2 -- "$megaplan" launch --nproc-per-node 2 --
  run reference-tp2sp --world-size 2 --tp 2 --sequence-parallel -- "$megaplan"
  run launch-tp2sp --tp 2 --sequence-parallel -- "$megaplan" launch --nproc-per-node 2 --
  rows+=("megaplan-launch 2 dp2 launch-dp2 reference-dp2" "megaplan-launch 2 pp2 launch-pp2 reference-pp2"
         "megaplan-launch 2 tp2 launch-tp2 reference-tp2" "megaplan-launch 2 tp2sp launch-tp2sp reference-tp2sp")
  if command -v torchrun > /dev/null; then
    # torchrun's agent keeps its store on MASTER_PORT: megaplan's rendezvous takes the next port.
    run torchrun-dp2 -- torchrun --nproc-per-node 2 --master-port 29611 --no-python "$megaplan"
    rows+=("torchrun 2 dp2 torchrun-dp2 reference-dp2")
  fi
fi

python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
codes = dict(line.split() for line in open(f"{out}/codes"))
def losses(name):
    try:
        return [json.loads(l)["loss"] for l in open(f"{out}/{name}.jsonl")]
    except Exception:
        return []
print(f"{'launcher':<16}{'world':>6}{'layout':>7}{'rc':>14}{'final loss':>12}  same losses as one process")
for row in sys.argv[2:]:
    launcher, world, layout, name, reference = row.split()
    ours, theirs = losses(name), losses(reference)
    final = f"{ours[-1]:.6f}" if ours else "-"
    same = "-" if not ours or not theirs else ("yes (bit for bit)" if ours == theirs else
        f"no: max relative difference {max(abs(a - b) / abs(b) for a, b in zip(ours, theirs)):.2e}")
    print(f"{launcher:<16}{world:>6}{layout:>7}{codes.get(name, '-'):>14}{final:>12}  {same}")
PY
# How each launched world got NCCL's id (rank 0's first line): over MPI under mpirun where
# megaplan was built with Open MPI, else over the TCP rendezvous.
for name in launch-1 mpirun-1 torchrun-1; do
  [ -f "$out/$name.txt" ] && echo "$name: $(grep -m1 'bootstrapped over' "$out/$name.txt")"
done
