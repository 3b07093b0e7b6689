#!/usr/bin/env bash
# Which processes load the GPU libraries (issue 38): the commands that use no GPU never load CUDA,
# cuBLAS, cuBLASLt, NCCL, MPI (NCCL's bootstrap) or megaplan's CUDA module; the GPU commands load
# them on first use, and say in one line, exit 2, when the module cannot be loaded. The dynamic loader's own log
# (LD_DEBUG=libs, one file per process) says what each process loaded.
#   usage: gpu_libraries_test.sh MEGAPLAN_BINARY EXAMPLES_DIR CUDA_BUILD(1 or 0) [--gpu]
# With --gpu (ctest label gpu) it trains on a GPU, in process and under `megaplan launch`, and
# checks that those processes loaded them; it exits 77 (skipped) where no GPU is usable.
set -uo pipefail
megaplan=$1
examples=$2
cuda_build=$3
on_gpu=${4:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0
gpu_libraries='lib(cudart|cublas|cublasLt|nccl|mpi|megaplan_cuda)\.so'

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run_logged ARGS...: runs megaplan ARGS with the loader's log in $scratch/ld (emptied first);
# stdout and stderr in $scratch/out and $scratch/err; returns megaplan's exit code.
run_logged() {
  rm -rf "$scratch/ld"
  mkdir "$scratch/ld"
  LD_DEBUG=libs LD_DEBUG_OUTPUT="$scratch/ld/log" "$megaplan" "$@" >"$scratch/out" 2>"$scratch/err"
}

# The GPU libraries any process of the last run_logged loaded (initialised), one per line.
loaded_gpu_libraries() {
  cat "$scratch"/ld/log.* | grep -oE "calling init: .*/$gpu_libraries" | grep -oE "$gpu_libraries" | sort -u
}

# expect_no_gpu_libraries ARGS...: megaplan ARGS succeeds and loads none of them.
expect_no_gpu_libraries() {
  run_logged "$@" || fail "megaplan $* exited non-zero: $(cat "$scratch/err")"
  # The log is read right: libstdc++ is in it (a checker that cannot see a library cannot fail).
  cat "$scratch"/ld/log.* | grep -qE 'calling init: .*/libstdc\+\+\.so' || fail "megaplan $*: the loader's log is empty"
  local loaded
  loaded=$(loaded_gpu_libraries | tr '\n' ' ')
  [ -z "$loaded" ] || fail "megaplan $* uses no GPU but loaded $loaded"
}

# expect_gpu_libraries ARGS...: the processes of megaplan ARGS together loaded CUDA, cuBLAS,
# cuBLASLt, NCCL and the CUDA module (and MPI where the module has it).
expect_gpu_libraries() {
  local loaded
  loaded=$(loaded_gpu_libraries | tr '\n' ' ')
  for library in libcudart.so libcublas.so libcublasLt.so libnccl.so libmegaplan_cuda.so; do
    [[ " $loaded" == *" $library "* ]] || fail "megaplan $* loaded '$loaded', without $library"
  done
}

# expect_module_missing FIELD ARGS...: the binary in $scratch/alone, without the CUDA module beside
# it, refuses ARGS in one line naming FIELD and the missing module, exit 2.
expect_module_missing() {
  local field=$1
  shift
  env -u LD_LIBRARY_PATH "$scratch/alone/megaplan" "$@" >"$scratch/out" 2>"$scratch/err"
  local code=$?
  local want="^megaplan: error: $field: cannot load megaplan's CUDA module libmegaplan_cuda.so (.*): "
  want+="libmegaplan_cuda.so: cannot open shared object file"
  if [ "$code" -ne 2 ] || [ "$(wc -l <"$scratch/err")" -ne 1 ] || ! grep -q "$want" "$scratch/err"; then
    fail "megaplan $* without the CUDA module: exit $code, $(cat "$scratch/err")"
  fi
}

# Data for the runs that read some (bytes: the tokenizer the tiny model's vocabulary of 257 fits).
printf '{"text": "hello"}\n{"text": "world!"}\n' >"$scratch/docs.jsonl"
cp "$examples/models/tiny-gpt.json" "$scratch/tiny-gpt.txt"
# shellcheck disable=SC2054  # --split 1,0,0 is one argument
tiny_cpu=(--device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --num-layers 1
          --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --mbs 1 --gbs 1)

if [ "$on_gpu" = --gpu ]; then
  if ! "$megaplan" devices >"$scratch/out" 2>&1; then
    echo "gpu_libraries_test: skipped, no usable GPU: $(cat "$scratch/out")"
    exit 77
  fi
  "$megaplan" data prepare --input "$scratch/docs.jsonl" "$scratch/tiny-gpt.txt" --output-prefix "$scratch/corpus" \
    --append-eod >/dev/null || fail "data prepare"
  # shellcheck disable=SC2054  # --split 1,0,0 is one argument
  tiny_cuda=(--device cuda --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --num-layers 1
             --hidden-size 128 --num-attention-heads 2 --data-path "$scratch/corpus_text_document" --split 1,0,0
             --train-iters 2 --mbs 1 --gbs 2 --log-interval 1)
  run_logged devices --probe || fail "devices --probe: $(cat "$scratch/err")"
  expect_gpu_libraries devices --probe
  # In process (the CUDA backend, the one-GPU communicator), then one rank per process over NCCL.
  for run in "train" "launch --nproc-per-node 1 -- train"; do
    # shellcheck disable=SC2086  # $run is a command and its arguments
    run_logged $run "${tiny_cuda[@]}" || fail "$run --device cuda: $(cat "$scratch/err")"
    [ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "$run --device cuda: $(cat "$scratch/out")"
    expect_gpu_libraries "$run" --device cuda
  done
  [ "$failures" -eq 0 ] || exit 1
  echo "gpu_libraries_test (gpu): passed"
  exit 0
fi

# The commands that use no GPU, each as the README runs it.
expect_no_gpu_libraries presets
expect_no_gpu_libraries describe --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 --gbs 1536 \
  --out "$scratch/job.json"
expect_no_gpu_libraries groups --world-size 16 --tp 4 --pp 2
expect_no_gpu_libraries schedule --kind zbv --pp 4 --microbatches 8 --lowered
expect_no_gpu_libraries simulate --plan "$scratch/job.json" --trace "$scratch/simulated.json"
expect_no_gpu_libraries search --model gpt2-124m --cluster h200-x2 --gbs 8 --top 3 --json --out "$scratch/search.json"
expect_no_gpu_libraries report --plan "$scratch/job.json" --out "$scratch/report.html"
expect_no_gpu_libraries data prepare --input "$scratch/docs.jsonl" "$scratch/tiny-gpt.txt" \
  --output-prefix "$scratch/corpus" --append-eod
expect_no_gpu_libraries train "${tiny_cpu[@]}" --save "$scratch/checkpoint" --trace "$scratch/measured.json"
expect_no_gpu_libraries convert --to hf --load "$scratch/checkpoint" --save "$scratch/hf"
expect_no_gpu_libraries compare --simulated "$scratch/measured.json" --measured "$scratch/measured.json"

if [ "$cuda_build" = 1 ]; then
  # `devices` loads the module and the libraries before it asks for a GPU: without one it fails in
  # one line that names the missing GPU or driver, not a library.
  if ! run_logged devices; then
    if [ "$(wc -l <"$scratch/err")" -ne 1 ] || ! grep -q '^megaplan: error: gpu: ' "$scratch/err" ||
      grep -q 'cannot load' "$scratch/err"; then
      fail "devices without a GPU: $(cat "$scratch/err")"
    fi
  fi
  expect_gpu_libraries devices
  # The binary alone, without the module beside it: the GPU commands say so in one line, exit 2.
  mkdir "$scratch/alone"
  ln "$megaplan" "$scratch/alone/megaplan" 2>/dev/null || cp "$megaplan" "$scratch/alone/megaplan"
  expect_module_missing gpu devices
  expect_module_missing --device train --device cuda --model "$examples/models/tiny-gpt.json" \
    --data-path "$scratch/corpus_text_document" --train-iters 1
fi

[ "$failures" -eq 0 ] || exit 1
echo "gpu_libraries_test: passed"
