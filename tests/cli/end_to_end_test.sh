#!/usr/bin/env bash
# The megaplan binary end to end: help for every subcommand, and bad input that must give exactly
# one line on stderr, exit code 2, nothing on stdout and no file written.
#   usage: end_to_end_test.sh MEGAPLAN_BINARY EXAMPLES_DIR
set -uo pipefail
megaplan=$1
examples=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

expect_ok() {
  if ! "$megaplan" "$@" >"$scratch/out" 2>"$scratch/err"; then
    fail "megaplan $* exited non-zero: $(cat "$scratch/err")"
  fi
}

# expect_error PATTERN ARGS...: exit 2, stdout empty, stderr one line matching PATTERN (grep -E).
expect_error() {
  local pattern=$1
  shift
  "$megaplan" "$@" >"$scratch/out" 2>"$scratch/err"
  local code=$?
  local lines
  lines=$(wc -l <"$scratch/err")
  [ "$code" -eq 2 ] || fail "megaplan $*: exit code $code, want 2"
  [ "$lines" -eq 1 ] || fail "megaplan $*: $lines lines on stderr, want 1: $(cat "$scratch/err")"
  [ ! -s "$scratch/out" ] || fail "megaplan $*: wrote to stdout: $(head -c 200 "$scratch/out")"
  grep -qE "$pattern" "$scratch/err" || fail "megaplan $*: stderr '$(cat "$scratch/err")' does not match '$pattern'"
}

# Help and version.
expect_ok --help
expect_ok --version
grep -q "megaplan 0" "$scratch/out" || fail "--version prints no version"
for command in compare convert data describe devices groups launch presets profile report schedule search simulate train; do
  expect_ok "$command" --help
  grep -q "Usage" "$scratch/out" || fail "$command --help prints no usage"
done

# The main job and a round trip through a job file.
expect_ok describe --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 --gbs 1536 --out "$scratch/job.json"
[ -s "$scratch/job.json" ] || fail "describe --out wrote no file"
expect_ok describe --plan "$scratch/job.json" --json
expect_ok describe --model "$examples/hf/llama3-8b-config.json" --cluster h200-x2 --tp 2 --seq-length 4096
expect_ok groups --world-size 16 --tp 4 --pp 2 --json
expect_ok presets

# Bad input: one line naming the field and the rule.
expect_error 'error: --model: unknown preset "gpt5"; known presets: gpt2-124m' describe --model gpt5 --cluster h100-x1
printf '{\n  "num_layers": 2,\n  "hidden_size": 64\n  "x": 1\n}\n' >"$scratch/broken.json"
expect_error "error: $scratch/broken.json:4:5: malformed JSON" describe --model "$scratch/broken.json" --cluster h100-x1
expect_error 'error: --num-layers: must be a positive integer, got 0' describe --model gpt2-124m --cluster h100-x1 --num-layers 0
# Hostile JSON: 100k levels deep, a number beyond a double, in every kind of JSON file megaplan reads.
python3 -c 'print("[" * 100000 + "]" * 100000)' >"$scratch/deep.json"
expect_error "error: $scratch/deep.json:1:65: malformed JSON: arrays and objects nest deeper than 64 levels" describe --model "$scratch/deep.json" --cluster h100-x1
expect_error "error: $scratch/deep.json:1:65: malformed JSON" simulate --model gpt2-124m --cluster "$scratch/deep.json"
expect_error "error: .*deep.json:1:65: malformed JSON" simulate --plan "$scratch/deep.json"
printf '{"num_layers": 1e999}\n' >"$scratch/huge.json"
expect_error "error: $scratch/huge.json: malformed JSON: the number '1e999' is beyond a double's range" describe --model "$scratch/huge.json" --cluster h100-x1
# A control character in a name is escaped: the error stays one line.
expect_error 'error: --model: unknown preset "gpt\\nfive"' describe --model "$(printf 'gpt\nfive')" --cluster h100-x1
expect_error 'error: --implementation: must be one of megaplan, megatron-core, megatron-local; got "nemo"' simulate --model gpt2-124m --cluster h100-x1 --implementation nemo
# Megatron-LM's implementation flags: defaults by --implementation, overrides, and their rules.
expect_ok simulate --model gpt-1.3b --cluster dgx-h100 --gpus 8 --tp 2 --pp 2 --gbs 16 --implementation megatron-local
grep -q '^code       megatron-local: fp16 with fp16 main gradients; local layers, unfused attention' "$scratch/out" ||
  fail "simulate names megatron-local's options: $(cat "$scratch/out")"
expect_ok simulate --model gpt-1.3b --cluster dgx-h100 --gpus 8 --tp 2 --gbs 16 --implementation megatron-local --bf16 \
  --use-flash-attn --attention-dropout 0 --hidden-dropout 0 --overlap-grad-reduce --json
grep -q '"precision": "bf16"' "$scratch/out" || fail "simulate --json holds the implementation options"
grep -q '"use_flash_attn": true' "$scratch/out" || fail "simulate --json holds --use-flash-attn"
expect_ok simulate --model gpt2-124m --cluster h100-x1 --fp16 --implementation megaplan
grep -q '^code       megaplan: fp16' "$scratch/out" || fail "megaplan's executor does not cost --fp16: $(cat "$scratch/out")"
expect_error 'error: --fp16 excludes --bf16' simulate --model gpt2-124m --cluster h100-x1 --implementation megatron-local --fp16 --bf16
expect_error 'error: --hidden-dropout: must be a dropout probability in \[0, 1\), got 1.5' simulate --model gpt2-124m --cluster h100-x1 --implementation megatron-core --hidden-dropout 1.5
expect_error 'error: --tp-comm-overlap: needs --sequence-parallel' simulate --model gpt-1.3b --cluster dgx-h100 --gpus 8 --tp 2 --gbs 4 --implementation megatron-core --tp-comm-overlap
expect_ok simulate --model gpt-1.3b --cluster dgx-h100 --gpus 8 --tp 2 --gbs 16 --implementation megatron-local --DDP-impl torch
grep -q '^code       .*overlapped: gradient reduction; PyTorch DDP' "$scratch/out" || fail "simulate names PyTorch DDP: $(cat "$scratch/out")"
expect_error 'error: --DDP-impl: torch cannot accumulate gradients in fp32' simulate --model gpt2-124m --cluster h100-x1 --implementation megatron-local --DDP-impl torch --bf16
expect_error 'error: --DDP-impl: must be one of local, torch; got "apex"' simulate --model gpt2-124m --cluster h100-x1 --implementation megatron-local --DDP-impl apex
expect_error 'error: --transformer-impl: must be one of local, transformer_engine; got "apex"' simulate --model gpt2-124m --cluster h100-x1 --implementation megatron-core --transformer-impl apex
expect_error 'error: --context-parallel-size: needs --transformer-impl transformer_engine' simulate --model gpt-1.3b --cluster dgx-h100 --gpus 8 --cp 2 --gbs 4 --implementation megatron-local
expect_ok describe --model gpt-1.3b --cluster dgx-h100 --gpus 8 --tp 2 --gbs 16 --implementation megatron-local --hidden-dropout 0 --out "$scratch/local.json"
grep -q '"hidden_dropout": 0' "$scratch/local.json" || fail "describe --out writes the implementation options"
expect_ok simulate --plan "$scratch/local.json"
grep -q 'dropout 0.1 attention, 0 hidden' "$scratch/out" || fail "simulate --plan reads the options back: $(cat "$scratch/out")"
# Flags beside a job file override it, as extra arguments after a base script do.
expect_ok simulate --plan "$scratch/local.json" --bf16 --hidden-dropout 0.2
grep -q 'bf16 .*dropout 0.1 attention, 0.2 hidden' "$scratch/out" || fail "flags beside --plan do not override it: $(grep '^code' "$scratch/out")"
expect_ok search --model gpt-1.3b --cluster dgx-h100 --gpus 8 --gbs 64 --implementation megatron-local --top 3
grep -q '^code (#1): megatron-local: fp16' "$scratch/out" || fail "search names the implementation: $(cat "$scratch/out")"
expect_error 'error: --implementation: must be megaplan to train' train --model gpt2-124m --implementation megatron-core --data-path /nonexistent --train-iters 1
expect_error 'error: --hidden-size: must be a positive integer, got -768' describe --model gpt2-124m --cluster h100-x1 --hidden-size -768
expect_error 'error: --hidden-size: must be at most 1048576 \(parameter counts multiply its square\), got 4611686018427387904' describe --model gpt2-124m --cluster h100-x1 --hidden-size 4611686018427387904 --num-attention-heads 1
expect_error 'error: --vocab-size: must be at most 16777216 \(embedding sizes multiply it\), got 9223372036854775807' describe --model gpt2-124m --cluster h100-x1 --vocab-size 9223372036854775807
expect_error 'error: --gpus: world size 1024 must be divisible by tp\*pp\*cp = 8\*3\*1 = 24' describe --model gpt3-175b --gpus 1024 --tp 8 --pp 3
expect_error 'error: --tensor-model-parallel-size: must divide --num-attention-heads 25' describe --model gpt2-1.5b --cluster h200-x2 --tp 2
expect_error 'error: --gpus: 16 GPUs exceed cluster h200-x2' describe --model gpt2-124m --cluster h200-x2 --gpus 16
expect_error 'error: --world-size' groups --world-size 16 --tp 3
expect_error 'error: --tensor-model-paralel-size: is not an argument of this command nor of Megatron-LM .*; did you mean --tensor-model-parallel-size\?' \
  describe --model gpt2-124m --cluster h200-x2 --tensor-model-paralel-size 2
expect_error 'error: .*' describe --tp notanumber
expect_error 'error: --cluster: unknown preset "dgx-z"; known presets: dgx-a100-80gb' describe --cluster dgx-z --gpus 8
expect_error 'error: --model: cannot be combined with --plan: the job file holds the model' describe --plan "$scratch/job.json" --model gpt2-124m

# A failing describe must not leave a file behind.
expect_error 'error: --tensor-model-parallel-size' describe --model gpt2-1.5b --cluster h200-x2 --tp 2 --out "$scratch/never.json"
[ ! -e "$scratch/never.json" ] || fail "a failed describe wrote --out"
ls "$scratch" | grep -q '\.tmp\.' && fail "a temporary file was left behind"

# Schedules: generate, write torch's CSV, import and check it; each kind and format runs.
expect_ok schedule --kind zbv --pp 4 --microbatches 8 --lowered --format csv --out "$scratch/zbv.csv"
expect_ok schedule --import "$scratch/zbv.csv" --check
grep -q '^ok: .*pp 4, 8 stages (v), 8 microbatches, lowered' "$scratch/out" || fail "schedule --check: $(cat "$scratch/out")"
for kind in gpipe 1f1b zb-h1 zbv dualpipev; do
  expect_ok schedule --kind "$kind" --pp 4 --microbatches 8 --format json
done
expect_ok schedule --kind interleaved --pp 4 --vpp 2 --microbatches 12 --microbatch-group-size 6 --lowered
grep -q '^rank 3: ' "$scratch/out" || fail "schedule text output has no rank 3 row"

# expect_schedule_error PATTERN ARGS...: exit 2, nothing on stdout, the error line matching
# PATTERN, then only grid rows ("rank N: ..."), where the actions at fault are marked >>so<<.
expect_schedule_error() {
  local pattern=$1
  shift
  "$megaplan" "$@" >"$scratch/out" 2>"$scratch/err"
  local code=$?
  [ "$code" -eq 2 ] || fail "megaplan $*: exit code $code, want 2"
  [ ! -s "$scratch/out" ] || fail "megaplan $*: wrote to stdout"
  head -n 1 "$scratch/err" | grep -qE "$pattern" || fail "megaplan $*: first line '$(head -n 1 "$scratch/err")' does not match '$pattern'"
  tail -n +2 "$scratch/err" | grep -vqE '^rank [0-9]+:' && fail "megaplan $*: stray stderr lines: $(cat "$scratch/err")"
  [ "$(wc -l <"$scratch/err")" -gt 1 ] || fail "megaplan $*: no grid below the error line"
}
printf '0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n' >"$scratch/ok.csv"
expect_ok schedule --import "$scratch/ok.csv" --check
printf '0F0,0RECV_B0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n' >"$scratch/hang.csv"
expect_schedule_error 'error: schedule: deadlock: these actions wait on each other: ' schedule --import "$scratch/hang.csv" --check
grep -q '^rank 0: 0F0 >>0RECV_B0<< ' "$scratch/err" || fail "deadlock grid does not mark 0RECV_B0: $(cat "$scratch/err")"
printf '0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n' >"$scratch/missing.csv"
expect_schedule_error 'error: schedule: incomplete: no rank runs 0B1' schedule --import "$scratch/missing.csv" --check
printf '0F0,0F0,0B0\n1F0,1B0\n' >"$scratch/duplicate.csv"
expect_schedule_error 'error: schedule: duplicate: 0F0 \(rank 0, step 1\) repeats the work of 0F0 \(rank 0, step 0\)' schedule --import "$scratch/duplicate.csv" --check
grep -q '^rank 0: >>0F0<< >>0F0<< 0B0' "$scratch/err" || fail "duplicate grid does not mark both forwards"
printf '0F0,0B0\n1F0,1Z0,1B0\n' >"$scratch/unknown.csv"
expect_error "error: $scratch/unknown.csv:2:2: unknown action \"1Z0\"" schedule --import "$scratch/unknown.csv" --check
# A cell of 20,000 nested overlaps (issue 42) is refused before it is parsed.
python3 -c 'import sys; sys.stdout.write("0F0,0B0\n" + "(" * 20000 + "1F0" + ";1B0)OVERLAP_F_B" * 20000 + "\n")' >"$scratch/nested.csv"
expect_error "error: $scratch/nested.csv:2:1: an action of 340003 characters" schedule --import "$scratch/nested.csv" --check
expect_error 'error: --microbatches: the interleaved schedule needs microbatches % group size to be 0 or >= pp; got 6 % 4 = 2 with pp 4' schedule --kind interleaved --pp 4 --vpp 2 --microbatches 6
expect_error 'error: --vpp: zbv runs two stages per rank in a V; needs vpp = 2, got 3' schedule --kind zbv --pp 4 --vpp 3 --microbatches 8
expect_error 'error: --kind: must be one of gpipe, 1f1b' schedule --kind zb-h2 --pp 4 --microbatches 8
expect_error 'error: --check: needs --import FILE' schedule --kind 1f1b --pp 4 --microbatches 8 --check
expect_error 'error: .*--import.*excludes|error: .*excludes.*--import' schedule --import "$scratch/ok.csv" --pp 4
expect_error "error: $scratch/none.csv: cannot read file" schedule --import "$scratch/none.csv" --check
expect_error 'error: --microbatches: dualpipev needs' schedule --kind dualpipev --pp 4 --microbatches 6 --out "$scratch/never.csv"
[ ! -e "$scratch/never.csv" ] || fail "a failed schedule wrote --out"

# Simulation: text, JSON with the documented names, a Chrome trace, a job file, a profile file.
expect_ok simulate --model gpt3-175b --cluster dgx-a100-80gb --gpus 1024 --tp 8 --pp 16 --gbs 1536 --sequence-parallel
grep -q '^iteration ' "$scratch/out" || fail "simulate prints no iteration time"
grep -q 'kernel times from a fallback' "$scratch/out" || fail "simulate does not say where kernel times came from"
expect_ok simulate --model gpt2-124m --cluster h200-x2 --tp 2 --gbs 8 --mbs 2 --json --trace "$scratch/trace.json"
for key in iteration_time_s model_tflops_per_gpu mfu bubble_fraction peak_memory_bytes fits_in_memory stages compute_s exposed_comm_s idle_s; do
  grep -q "\"$key\"" "$scratch/out" || fail "simulate --json has no $key"
done
grep -q '"traceEvents"' "$scratch/trace.json" || fail "simulate --trace wrote no Chrome trace"
grep -q '"profile":"H200-SXM-141GB, measured' "$scratch/trace.json" || fail "simulate --trace names no profile in otherData"
grep -q '"kind": "measured"' "$scratch/out" || fail "simulate on an H200 does not default to its measured profile"
grep -q '"origin": "profiles/h200-sxm-141gb.measured.json (built in)"' "$scratch/out" || fail "simulate --json does not name the built-in profile"
expect_ok simulate --model gpt2-124m --cluster dgx-a100-80gb --gpus 8 --gbs 8
grep -q '^profile    A100-SXM4-80GB, transferred: profiles/h100-sxm5-80gb.measured.json (built in); transferred from H100-SXM5-80GB' "$scratch/out" ||
  fail "simulate does not say an unmeasured GPU's profile is transferred: $(cat "$scratch/out")"
grep -q 'with wave quantisation for 108 SMs' "$scratch/out" || fail "the A100's transfer does not use its SMs"
expect_ok search --model gpt2-124m --cluster h100-x1 --gbs 8 --json
grep -q '"kind": "measured"' "$scratch/out" || fail "search --json does not name its measured profile"
grep -q '"tie_tolerance": 0.04' "$scratch/out" || fail "search --json does not state the profile's uncertainty"
grep -q '"tie_with_best": ' "$scratch/out" || fail "search --json does not mark ties"
expect_ok describe --model gpt2-124m --cluster h200-x2 --pp 2 --gbs 8 --out "$scratch/small-job.json"
expect_ok simulate --plan "$scratch/small-job.json"
# The HTML report: written whole, or refused in one line with nothing left behind.
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --top 4 --threads 2 --json
cp "$scratch/out" "$scratch/search.json"
expect_ok report --plan "$scratch/small-job.json" --search "$scratch/search.json" --out "$scratch/report.html"
grep -q '^wrote .*report.html (' "$scratch/out" || fail "report says nothing: $(cat "$scratch/out")"
grep -q 'window.MEGAPLAN = {' "$scratch/report.html" || fail "the report holds no data"
grep -q 'd3js.org v5.16.0' "$scratch/report.html" || fail "the report does not embed d3"
if grep -q 'src="http\|href="http' "$scratch/report.html"; then fail "the report fetches something at view time"; fi
expect_error "error: .*nowhere.json: cannot read file" report --plan "$scratch/nowhere.json" --out "$scratch/never.html"
printf '{"plans": [{"tensor_parallel_size": 1}]}' >"$scratch/bad-search.json"
expect_error "error: .*bad-search.json: plans\[0\]: .*required field is missing" report --plan "$scratch/small-job.json" --search "$scratch/bad-search.json" --out "$scratch/never.html"
printf '{"plans": [' >"$scratch/cut-search.json"
expect_error "error: .*cut-search.json" report --plan "$scratch/small-job.json" --search "$scratch/cut-search.json" --out "$scratch/never.html"
[ ! -e "$scratch/never.html" ] || fail "a refused report left a file behind"
expect_ok simulate --plan "$scratch/small-job.json" --json --report "$scratch/simulate-report.html"
grep -q '"iteration_time_s"' "$scratch/out" || fail "simulate --json --report prints no JSON"
grep -q 'window.MEGAPLAN = {' "$scratch/simulate-report.html" || fail "simulate --report wrote no report"
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --top 3 --threads 2 --report "$scratch/search-report.html"
grep -q '"alternatives":{"plans":\[' "$scratch/search-report.html" || fail "search --report has no alternatives"
expect_ok simulate --model gpt2-124m --cluster "$examples/clusters/a100-40gb-4node.json" --gpus 8 --gbs 8 --profile "$examples/profiles/a100-sxm4-40gb.datasheet.json"
expect_ok simulate --model gpt3-175b --cluster dgx-h100 --gpus 8 --tp 8 --json
grep -q '"fits_in_memory": false' "$scratch/out" || fail "gpt3-175b on 8 GPUs should not fit"
grep -q '"memory_shortfall_bytes": [1-9]' "$scratch/out" || fail "the shortfall is not named"
expect_ok simulate --model gpt2-124m --cluster "$examples/clusters/a100-40gb-4node.json" --gpus 8 --json
grep -q '"kind": "transferred"' "$scratch/out" || fail "a cluster file's GPU gets a transferred profile"
# Transferred profiles as files: H100's measured tables carried to the H200 and the A100.
expect_ok profile --transfer-to H200-SXM-141GB --profile "$examples/../profiles/h100-sxm5-80gb.measured.json" --out "$scratch/h200-from-h100.json"
expect_ok simulate --model gpt2-124m --cluster h200-x1 --gbs 8 --profile "$scratch/h200-from-h100.json" --json
grep -q '"kind": "transferred"' "$scratch/out" || fail "simulate names a transferred profile file's kind"
# The H100's profile states 0.04, as the validated same-die transfer does; the H200's states 0.05.
grep -q '"uncertainty": 0.04' "$scratch/out" || fail "a same-die transfer states the validated transfer uncertainty"
expect_ok profile --transfer-to H100-SXM5-80GB --profile "$examples/../profiles/h200-sxm-141gb.measured.json" --out "$scratch/h100-from-h200.json"
expect_ok simulate --model gpt2-124m --cluster h100-x1 --gbs 8 --profile "$scratch/h100-from-h200.json" --json
grep -q '"uncertainty": 0.05' "$scratch/out" || fail "a same-die transfer states the larger of the source's and the validated transfer uncertainty"
expect_ok profile --transfer-to A100-SXM4-80GB
grep -q '"transferred_from"' "$scratch/out" || fail "profile --transfer-to prints the transferred profile"
expect_error 'error: --transfer-to: "B200" is no preset GPU' profile --transfer-to B200
expect_ok profile --leave-one-out --profile "$examples/../profiles/h200-sxm-141gb.measured.json"
grep -q '^gemm bf16 forward none ' "$scratch/out" || fail "profile --leave-one-out prints a row per table"
expect_error 'error: --leave-one-out: checks a profile: pass --profile FILE' profile --leave-one-out
expect_error 'error: --transfer-to: H100-SXM5-80GB has a measured profile of its own' profile --transfer-to H100-SXM5-80GB
expect_error 'a100-sxm4-80gb.datasheet.json: holds no measured table to transfer' profile --transfer-to H100-SXM5-80GB --profile "$examples/../profiles/a100-sxm4-80gb.datasheet.json"
expect_error 'error: --profile: .* profiles A100-SXM4-80GB, but the cluster.s GPU is H200-SXM-141GB' simulate --model gpt2-124m --cluster h200-x2 --profile "$examples/../profiles/a100-sxm4-80gb.datasheet.json"
expect_error 'error: --gpus: world size 1024 must be divisible by tp\*pp\*cp' simulate --model gpt3-175b --gpus 1024 --tp 8 --pp 3
expect_error 'error: --sequence-parallel: needs --tensor-model-parallel-size > 1' simulate --plan "$scratch/small-job.json" \
  --tp 1 --sequence-parallel
expect_error "error: $scratch/missing-profile.json: cannot read file" simulate --model gpt2-124m --cluster h200-x2 --profile "$scratch/missing-profile.json"
expect_error 'error: --tensor-model-parallel-size' simulate --model gpt2-1.5b --cluster h200-x2 --tp 2 --trace "$scratch/never-trace.json"
[ ! -e "$scratch/never-trace.json" ] || fail "a failed simulate wrote --trace"

# nccl-tests output measured elsewhere joins its GPU's profile, which simulate then loads.
{
  printf '# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor)\n#\n# Using devices\n'
  for r in 0 1 2 3 4 5 6 7; do
    printf '#  Rank %d Group  0 Pid %d on node0 device  %d [0000:1b:00] NVIDIA H100 80GB HBM3\n' "$r" "$((100 + r))" "$r"
  done
  printf '#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n'
  printf '     1048576        262144     float     sum      -1    25.00   41.94   73.40      0    24.80   42.28   73.99      0\n'
  printf '  1073741824     268435456     float     sum      -1   4600.0  233.42  408.49      0   4590.0  233.93  409.38      0\n'
} >"$scratch/all_reduce.txt"
expect_ok profile --import-nccl-tests "$scratch/all_reduce.txt" --out "$scratch/nccl-profile.json"
grep -q '"op": "all_reduce"' "$scratch/nccl-profile.json" || fail "profile --import-nccl-tests wrote no all_reduce table"
expect_ok simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --tp 4 --profile "$scratch/nccl-profile.json"
expect_error "error: --import-nccl-tests: $scratch/docs-missing.txt: cannot read file|error: $scratch/docs-missing.txt: cannot read file" profile --import-nccl-tests "$scratch/docs-missing.txt" --out "$scratch/never-profile.json"
printf 'hello\n' >"$scratch/not-nccl.txt"
expect_error "error: --import-nccl-tests: $scratch/not-nccl.txt: no nccl-tests table" profile --import-nccl-tests "$scratch/not-nccl.txt" --out "$scratch/never-profile.json"
[ ! -e "$scratch/never-profile.json" ] || fail "a failed profile --import-nccl-tests wrote its file"

# Data: text to Megatron's indexed dataset; broken input writes nothing.
printf '{"text": "hello"}\n{"text": "world!"}\n' >"$scratch/docs.jsonl"
cp "$examples/models/tiny-gpt.json" "$scratch/tiny-gpt.txt"  # not JSON lines: one document
expect_ok data prepare --input "$scratch/docs.jsonl" "$scratch/tiny-gpt.txt" --output-prefix "$scratch/corpus" --append-eod
grep -q '^wrote .*/corpus_text_document.bin and .idx: 3 documents, ' "$scratch/out" || fail "data prepare: $(cat "$scratch/out")"
[ -s "$scratch/corpus_text_document.bin" ] && [ -s "$scratch/corpus_text_document.idx" ] || fail "data prepare wrote no .bin/.idx"
head -c 7 "$scratch/corpus_text_document.idx" | grep -q MMIDIDX || fail "data prepare's .idx has no MMIDIDX magic"
printf '{"text": "fine"}\n{"text": \n' >"$scratch/bad.jsonl"
expect_error "error: --input: $scratch/bad.jsonl:2: malformed JSON" data prepare --input "$scratch/bad.jsonl" --output-prefix "$scratch/never"
expect_error "error: --input: $scratch/nothing.txt: cannot read file" data prepare --input "$scratch/nothing.txt" --output-prefix "$scratch/never"
expect_error 'error: --tokenizer: unknown tokenizer "wordpiece"' data prepare --input "$scratch/docs.jsonl" --output-prefix "$scratch/never" --tokenizer wordpiece
# GPT-2's BPE on the tiny vocabulary of tests/data/gpt2_tiny (its README works out these ids).
gpt2_tiny="$(dirname "$0")/../data/gpt2_tiny"
printf '{"text": "hello the world"}\n{"text": "hello!\\n"}\n' >"$scratch/bpe.jsonl"
expect_ok data prepare --input "$scratch/bpe.jsonl" --output-prefix "$scratch/bpe" --append-eod --tokenizer gpt2 \
  --vocab-file "$gpt2_tiny/vocab.json" --merge-file "$gpt2_tiny/merges.txt"
grep -q '^wrote .*: 2 documents, 8 tokens (vocabulary 268) ' "$scratch/out" || fail "data prepare gpt2: $(cat "$scratch/out")"
[ "$(od -An -tu2 -v "$scratch/bpe_text_document.bin" | tr -s ' \n' ' ')" = " 259 261 266 267 259 33 10 267 " ] ||
  fail "data prepare gpt2 wrote tokens $(od -An -tu2 -v "$scratch/bpe_text_document.bin")"
expect_error 'error: --merge-file: --tokenizer gpt2 needs its merges.txt' data prepare --input "$scratch/bpe.jsonl" --output-prefix "$scratch/never" --tokenizer gpt2 --vocab-file "$gpt2_tiny/vocab.json"
expect_error 'error: --vocab-file: --tokenizer byte does not read its vocab.json' data prepare --input "$scratch/bpe.jsonl" --output-prefix "$scratch/never" --vocab-file "$gpt2_tiny/vocab.json"
printf '#version: 0.2\nh e\nll\n' >"$scratch/bad-merges.txt"
expect_error "error: --merge-file: $scratch/bad-merges.txt:3: want two tokens separated by one space" data prepare --input "$scratch/bpe.jsonl" --output-prefix "$scratch/never" --tokenizer gpt2 --vocab-file "$gpt2_tiny/vocab.json" --merge-file "$scratch/bad-merges.txt"
# Hugging Face tokenizer.json (tests/data/hf_tiny: hello 259, " world" 262 through ignore_merges,
# <|begin_of_text|> 263, eos_token <|eot_id|> 265 from its tokenizer_config.json).
hf_tiny="$(dirname "$0")/../data/hf_tiny"
printf '{"text": "hello world"}\n{"text": "<|begin_of_text|>hello"}\n' >"$scratch/hf.jsonl"
expect_ok data prepare --input "$scratch/hf.jsonl" --output-prefix "$scratch/hf" --append-eod --tokenizer hf \
  --tokenizer-file "$hf_tiny/llama3-style/tokenizer.json"
grep -q '^wrote .*: 2 documents, 6 tokens (vocabulary 266) ' "$scratch/out" || fail "data prepare hf: $(cat "$scratch/out")"
[ "$(od -An -tu2 -v "$scratch/hf_text_document.bin" | tr -s ' \n' ' ')" = " 259 262 265 263 259 265 " ] ||
  fail "data prepare hf wrote tokens $(od -An -tu2 -v "$scratch/hf_text_document.bin")"
printf '{"model": {"type": "Unigram"}}' >"$scratch/unigram.json"
expect_error "error: --tokenizer-file: $scratch/unigram.json: model.type: must be \"BPE\"" data prepare --input "$scratch/hf.jsonl" --output-prefix "$scratch/never" --tokenizer hf --tokenizer-file "$scratch/unigram.json"
# SentencePiece (tests/data/sentencepiece_tiny; ids from spm_encode, eos_id 2).
spm_tiny="$(dirname "$0")/../data/sentencepiece_tiny"
printf '{"text": "hello world"}\n' >"$scratch/spm.jsonl"
expect_ok data prepare --input "$scratch/spm.jsonl" --output-prefix "$scratch/spm" --append-eod --tokenizer sentencepiece \
  --tokenizer-model "$spm_tiny/tiny.model"
grep -q '^wrote .*: 1 documents, 10 tokens (vocabulary 500) ' "$scratch/out" || fail "data prepare sentencepiece: $(cat "$scratch/out")"
[ "$(od -An -tu2 -v "$scratch/spm_text_document.bin" | tr -s ' \n' ' ')" = " 372 261 383 383 378 274 267 383 381 2 " ] ||
  fail "data prepare sentencepiece wrote tokens $(od -An -tu2 -v "$scratch/spm_text_document.bin")"
expect_error "error: --tokenizer-model: $scratch/spm.jsonl: not a SentencePiece model" data prepare --input "$scratch/spm.jsonl" --output-prefix "$scratch/never" --tokenizer sentencepiece --tokenizer-model "$scratch/spm.jsonl"
expect_error "error: --tokenizer-file: --tokenizer hf needs its tokenizer.json" data prepare --input "$scratch/spm.jsonl" --output-prefix "$scratch/never" --tokenizer hf
ls "$scratch" | grep -q '^never' && fail "a failed data prepare left files behind"

# Train on the CPU backend: a few iterations end to end, on one rank and on a pipeline of two ranks
# (threads); bad input names the flag.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --world-size 2 --pp 2 --schedule zbv --vpp 2 --num-layers 4 --mbs 1 --gbs 4 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --log-interval 1 --trace "$scratch/measured.json"
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "a pipeline's rank 0 prints one line per iteration: $(cat "$scratch/out")"
# Without a GPU, profile says so in one line and writes nothing.
if ! "$megaplan" devices >/dev/null 2>&1; then
  expect_error 'error: gpu: ' profile --quick --out "$scratch/never-profile.json"
  [ ! -e "$scratch/never-profile.json" ] || fail "a failed profile wrote --out"
fi
# The same plan simulated, and the two timelines compared action by action.
expect_ok simulate --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --cluster h200-x2 \
  --pp 2 --schedule zbv --vpp 2 --num-layers 4 --mbs 1 --gbs 4 --trace "$scratch/simulated.json"
expect_ok compare --simulated "$scratch/simulated.json" --measured "$scratch/measured.json"
grep -q '^order      every rank computed in the simulated order' "$scratch/out" || fail "compare: $(cat "$scratch/out")"
grep -qE '^ +1  W +8 ' "$scratch/out" || fail "compare lists rank 1's eight W: $(cat "$scratch/out")"
# The same with context parallelism: cp 2 x pp 2 trained as four threads, simulated on four GPUs.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --world-size 4 --pp 2 --cp 2 --num-layers 4 --mbs 1 --gbs 4 --data-path "$scratch/corpus_text_document" \
  --split 1,0,0 --train-iters 2 --trace "$scratch/measured-cp.json"
expect_ok simulate --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --cluster dgx-h200 \
  --gpus 4 --pp 2 --cp 2 --num-layers 4 --mbs 1 --gbs 4 --trace "$scratch/simulated-cp.json"
expect_ok compare --simulated "$scratch/simulated-cp.json" --measured "$scratch/measured-cp.json"
grep -q '^order      every rank computed in the simulated order' "$scratch/out" || fail "compare at cp 2: $(cat "$scratch/out")"
expect_ok compare --simulated "$scratch/simulated.json" --measured "$scratch/measured.json" --json
grep -q '"iteration_error"' "$scratch/out" || fail "compare --json: $(head -c 300 "$scratch/out")"
# The same model under another recomputation: another run.
expect_ok simulate --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --cluster h200-x2 \
  --pp 2 --schedule zbv --vpp 2 --num-layers 4 --mbs 1 --gbs 4 --recompute-granularity full --trace "$scratch/simulated-full.json"
expect_error "error: --measured: .*/measured.json is a trace of another run than .*/simulated-full.json's: parallel_plan.recompute_granularity is \"none\" there, \"full\" here" \
  compare --simulated "$scratch/simulated-full.json" --measured "$scratch/measured.json"
# A trace of another run is refused by what its metadata records (issue 42), and one recording
# nothing (written before megaplan did) by its action lists.
expect_error "error: --measured: .*/trace.json is a trace of another run than .*/simulated.json's: model_spec\\.ffn_hidden_size is 3072 there, 256 here" \
  compare --simulated "$scratch/simulated.json" --measured "$scratch/trace.json"
python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); t["otherData"].pop("identity"); json.dump(t, open(sys.argv[2], "w"))' \
  "$scratch/trace.json" "$scratch/older-trace.json"
expect_error 'error: --measured: .*/older-trace.json lacks [0-9A-Z_]+ on pipeline rank [01], which .*/simulated.json holds' compare --simulated "$scratch/simulated.json" --measured "$scratch/older-trace.json"
# The report of that plan with the measured timeline beside the simulated one.
tiny_pp2=(--model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --cluster h200-x2 --pp 2 --schedule zbv
          --vpp 2 --num-layers 4 --mbs 1 --gbs 4)
expect_ok report "${tiny_pp2[@]}" --measured "$scratch/measured.json" --simulated "$scratch/simulated.json" \
  --out "$scratch/measured-report.html"
grep -q '"measured":{"error":' "$scratch/measured-report.html" || fail "the report holds no measured section"
expect_error "error: --measured: .*/trace.json is a trace of another run than this plan's: model_spec\\." report "${tiny_pp2[@]}" --measured "$scratch/trace.json" --out "$scratch/never.html"
expect_error 'error: --measured: .*/older-trace.json lacks [0-9A-Z_]+ on pipeline rank [01]' report "${tiny_pp2[@]}" --measured "$scratch/older-trace.json" --out "$scratch/never.html"
expect_error "error: --simulated: .*/trace.json is a trace of another run than this plan's: model_spec\\." report "${tiny_pp2[@]}" --simulated "$scratch/trace.json" --out "$scratch/never.html"
expect_error 'error: --simulated: .*/older-trace.json is not a trace of this plan: ' report "${tiny_pp2[@]}" --simulated "$scratch/older-trace.json" --out "$scratch/never.html"
[ ! -e "$scratch/never.html" ] || fail "a refused report left a file behind"
printf 'not json' >"$scratch/not-json.txt"
expect_error 'error: --simulated: .*/not-json.txt is not JSON' compare --simulated "$scratch/not-json.txt" --measured "$scratch/measured.json"
expect_error 'error: --simulated: .*/missing.json: cannot read file' compare --simulated "$scratch/missing.json" --measured "$scratch/measured.json"
# The Llama family's flags, as a Megatron launch script spells them, under tp 2.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --rotary-base 500000 --group-query-attention \
  --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear --norm-epsilon 1e-6 \
  --world-size 2 --tp 2 --mbs 1 --gbs 2 --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "a Llama-style tp 2 run prints one line per iteration: $(cat "$scratch/out")"
# Its checkpoint to Hugging Face and back, into tp 2, and training on from there; bad files and
# destinations in one line each, nothing written.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --num-query-groups 2 \
  --untie-embeddings-and-output-weights --disable-bias-linear --use-rope-scaling --rope-scaling-factor 4 \
  --mbs 1 --gbs 2 --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --save "$scratch/llama-ckpt"
expect_ok convert --to hf --load "$scratch/llama-ckpt" --save "$scratch/llama-hf"
grep -q '"model_type": "llama"' "$scratch/llama-hf/config.json" || fail "convert --to hf: $(cat "$scratch/llama-hf/config.json")"
grep -q '"rope_type": "llama3"' "$scratch/llama-hf/config.json" || fail "convert --to hf drops the RoPE scaling: $(cat "$scratch/llama-hf/config.json")"
expect_error 'error: --rope-scaling-factor: needs --use-rope-scaling' describe --model llama3-8b --rope-scaling-factor 4
# Zero (or less) is no "unset" and no "none" (issue 42): refused, not read as the model's value.
expect_error 'error: --rope-scaling-factor: must be a finite number >= 1, got 0.0' \
  describe --model llama3-8b --use-rope-scaling --rope-scaling-factor 0
expect_error 'error: --ffn-hidden-size: must be a positive integer, got 0 \(leave the flag out' \
  describe --model llama3-8b --ffn-hidden-size 0
expect_error 'error: --num-query-groups: must be a positive integer, got 0' \
  describe --model llama3-8b --group-query-attention --num-query-groups 0
expect_error 'error: --kv-channels: must be a positive integer, got 0' describe --model llama3-8b --kv-channels 0
expect_ok convert --to megaplan --load "$scratch/llama-hf" --save "$scratch/llama-tp2" --tp 2
expect_ok train --device cpu --model "$scratch/llama-hf/config.json" --seq-length 16 --world-size 2 --tp 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --load "$scratch/llama-tp2" --log-interval 1
grep -q '^iteration 1/1 | loss ' "$scratch/out" || fail "train from a converted checkpoint: $(cat "$scratch/out")"
expect_error "error: --save: $scratch/llama-hf exists and is not empty" convert --to hf --load "$scratch/llama-ckpt" --save "$scratch/llama-hf"
mkdir -p "$scratch/bad-hf"
cp "$scratch/llama-hf/config.json" "$scratch/bad-hf/"
printf '\x35\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]}}\x01' >"$scratch/bad-hf/model.safetensors"
expect_error "error: --load: $scratch/bad-hf/model.safetensors: tensor \"a\" has dtype \"I8\", which megaplan does not read" convert --to megaplan --load "$scratch/bad-hf" --save "$scratch/never-ckpt"
[ ! -e "$scratch/never-ckpt/iter_0000000" ] || fail "a failed convert left a checkpoint behind"
expect_error 'error: --to: must be hf or megaplan, got "onnx"' convert --to onnx --load "$scratch/llama-ckpt" --save "$scratch/never"
# The GPT-3 175B script's training flags with its model flags scaled down and no --model (a model
# named custom, its vocabulary the data's): every training flag honoured, --fp16 with Megatron's
# dynamic loss scaler (the CPU backend computes in fp32 but runs the scaler).
gpt3_training=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 --max-position-embeddings 16
  --micro-batch-size 1 --global-batch-size 2 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95
  --init-method-std 0.006 --clip-grad 1.0 --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001
  --lr-decay-iters 430 --data-path "$scratch/corpus_text_document" --split 949,50,1 --log-interval 1 --eval-interval 1000
  --eval-iters 10 --tensorboard-dir "$scratch/tb")
expect_ok train --device cpu "${gpt3_training[@]}" --train-iters 2
grep -q '^training custom, ' "$scratch/out" || fail "Megatron's model flags alone do not train the custom model: $(cat "$scratch/out")"
grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "the GPT-3 script's training flags did not train: $(cat "$scratch/out")"
grep -q '^note: no effect on the run .*--tensorboard-dir' "$scratch/err" || fail "train's cosmetic flags: $(cat "$scratch/err")"
[ ! -e "$scratch/tb" ] || fail "train created --tensorboard-dir"
expect_ok train --device cpu "${gpt3_training[@]/--lr-decay-iters/--lr-decay-samples}" --train-samples 4
grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "--train-samples 4 at gbs 2 is not two iterations: $(cat "$scratch/out")"
expect_ok train --device cpu "${gpt3_training[@]}" --train-iters 2 --fp16 --log-file "$scratch/fp16.jsonl"
grep -q '^iteration 2/2 | loss .* | loss scale 4.29497e+09 | number of skipped iterations 0$' "$scratch/out" ||
  fail "--fp16 does not run the loss scaler: $(cat "$scratch/out")"
grep -q '"loss_scale":4294967296' "$scratch/fp16.jsonl" || fail "--log-file lacks the loss scale: $(cat "$scratch/fp16.jsonl")"
expect_ok train --device cpu "${gpt3_training[@]}" --train-iters 1 --loss-scale 4096 --initial-loss-scale 65536 \
  --min-loss-scale 2 --loss-scale-window 100 --hysteresis 1
grep -q '| loss scale 4096 | number of skipped iterations 0$' "$scratch/out" || fail "--loss-scale is not the scale: $(cat "$scratch/out")"
# Dropout with Megatron's flags: the run drops (masks from the seed and the element's place), and
# simulate costs the dropout passes under megaplan's implementation.
expect_ok train --device cpu "${gpt3_training[@]}" --train-iters 2 --hidden-dropout 0.1 --attention-dropout 0.1
grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "dropout did not train: $(cat "$scratch/out")"
expect_ok simulate --model gpt2-124m --cluster h100-x1 --hidden-dropout 0.1 --attention-dropout 0.1
grep -q '^code       megaplan: .*dropout 0.1 attention, 0.1 hidden' "$scratch/out" ||
  fail "simulate does not name megaplan's dropout: $(cat "$scratch/out")"
expect_error 'error: --min-loss-scale: must not exceed --initial-loss-scale' train --device cpu "${gpt3_training[@]}" \
  --train-iters 1 --fp16 --initial-loss-scale 1024 --min-loss-scale 4096
expect_error 'error: --train-samples: cannot be combined with --train-iters' train --device cpu "${gpt3_training[@]}" --train-iters 2 --train-samples 4
expect_error 'error: --num-layers: required for a model defined by Megatron' train --device cpu --hidden-size 64 --num-attention-heads 4 \
  --seq-length 16 --max-position-embeddings 16 --data-path "$scratch/corpus_text_document" --train-iters 1
expect_error 'error: --model: train needs a model' train --device cpu --data-path "$scratch/corpus_text_document" --train-iters 1
expect_error 'error: --disable-bias-linear: GELU without biases is not in the executor yet' train --device cpu --model "$examples/models/tiny-gpt.json" --disable-bias-linear --data-path "$scratch/corpus_text_document" --train-iters 2
# Mixture of experts trains on the CPU (issue 40): a Llama of MoE layers on a pipeline of two ranks;
# the layouts and experts the executor does not run yet are refused in one line.
moe_llama=(--model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --swiglu --normalization RMSNorm
  --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --num-experts 4
  --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 0.01 --moe-z-loss-coeff 0.001
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --mbs 1 --gbs 4)
expect_ok train --device cpu "${moe_llama[@]}" --world-size 2 --pp 2 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "an MoE pipeline's rank 0 prints one line per iteration: $(cat "$scratch/out")"
# Expert parallelism: two ranks each hold two of the experts, the tokens exchanged by all-to-all.
expect_ok train --device cpu "${moe_llama[@]}" --world-size 2 --ep 2 --use-distributed-optimizer --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss .* | load_balancing_loss ' "$scratch/out")" -eq 2 ] || fail "ep 2 trains: $(cat "$scratch/out")"
# A pipeline rank without MoE layers under ep 2: its second ep rank, a dp replica, writes nothing,
# and state.json lists only the directories written; the checkpoint loads.
expect_ok train --device cpu "${moe_llama[@]}" --moe-layer-freq '([1]+[0]*1)' --world-size 4 --pp 2 --ep 2 \
  --train-iters 2 --save "$scratch/dense-stage"
[ ! -e "$scratch/dense-stage/iter_0000002/mp_rank_00_001_001" ] || fail "a dense stage's dp replica wrote a directory"
expect_ok train --device cpu "${moe_llama[@]}" --moe-layer-freq '([1]+[0]*1)' --world-size 4 --pp 2 --ep 2 \
  --train-iters 3 --log-interval 1 --load "$scratch/dense-stage"
grep -q '^iteration 3/3 | loss ' "$scratch/out" || fail "a checkpoint with a dense stage under ep 2 loads: $(cat "$scratch/out")"
# The aux-loss-free expert bias (sigmoid routing): ep 2 saves it in state.json; one rank resumes from it.
expect_ok train --device cpu "${moe_llama[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
  --moe-router-bias-update-rate 0.01 --world-size 2 --ep 2 --train-iters 2 --log-interval 1 --save "$scratch/biased"
grep -q '"expert_biases"' "$scratch/biased/iter_0000002/state.json" || fail "the expert biases are not in state.json"
expect_ok train --device cpu "${moe_llama[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias \
  --moe-router-bias-update-rate 0.01 --train-iters 3 --log-interval 1 --load "$scratch/biased"
grep -q '^iteration 3/3 | loss ' "$scratch/out" || fail "one rank resumes the expert biases: $(cat "$scratch/out")"
expect_error 'error: --moe-router-enable-expert-bias: needs --moe-router-score-function sigmoid' \
  train --device cpu "${moe_llama[@]}" --moe-router-enable-expert-bias --train-iters 1
expect_error 'error: --expert-model-parallel-size: must divide --num-experts 4' \
  train --device cpu "${moe_llama[@]}" --world-size 3 --ep 3 --train-iters 1
expect_error 'error: --moe-token-dispatcher-type: the allgather token dispatcher \(it runs alltoall\) is not in the executor yet' \
  train --device cpu "${moe_llama[@]}" --world-size 2 --ep 2 --moe-token-dispatcher-type allgather --train-iters 1
expect_error 'error: --moe-token-dispatcher-type: must be alltoall, allgather or flex, got "deepep"' \
  train --device cpu "${moe_llama[@]}" --moe-token-dispatcher-type deepep --train-iters 1
expect_error 'error: --moe-token-dispatcher-type: needs --num-experts' \
  describe --model llama3-8b --cluster h200-x2 --moe-token-dispatcher-type allgather
# Tensor parallelism with sequence parallelism: each tp rank routes its rows, every rank a shard of each expert.
expect_ok train --device cpu "${moe_llama[@]}" --world-size 4 --tp 2 --sequence-parallel --ep 2 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss .* | load_balancing_loss ' "$scratch/out")" -eq 2 ] || fail "tp 2 x ep 2 trains: $(cat "$scratch/out")"
# --expert-tensor-parallel-size 1: whole experts on each tp rank, the ep group across them.
expect_ok train --device cpu "${moe_llama[@]}" --world-size 2 --tp 2 --sequence-parallel --ep 2 --etp 1 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss .* | load_balancing_loss ' "$scratch/out")" -eq 2 ] || fail "tp 2 x ep 2, etp 1 trains: $(cat "$scratch/out")"
expect_error 'error: --sequence-parallel: mixture of experts under tensor parallelism without sequence parallelism is not in the executor yet' \
  train --device cpu "${moe_llama[@]}" --world-size 2 --tp 2 --train-iters 1
# A split backward: I keeps the MoE MLP's output gradients, W takes its weight gradients.
expect_ok train --device cpu "${moe_llama[@]}" --world-size 2 --pp 2 --schedule zb-h1 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss .* | load_balancing_loss ' "$scratch/out")" -eq 2 ] || fail "pp 2 zb-h1 trains: $(cat "$scratch/out")"
expect_error 'error: --swiglu: mixture of experts with GELU experts is not in the executor yet' \
  train --device cpu --model "$examples/models/tiny-gpt.json" --num-experts 4 --data-path "$scratch/corpus_text_document" --train-iters 1
expect_error 'error: --rotary-percent: must be in \(0, 1\], got 2.0' train --device cpu --model "$examples/models/tiny-gpt.json" --position-embedding-type rope --rotary-percent 2 --data-path "$scratch/corpus_text_document" --train-iters 2
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --world-size 4 --tp 2 --sequence-parallel --pp 2 --num-layers 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "tp 2 x pp 2 prints one line per iteration: $(cat "$scratch/out")"
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --world-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --ddp-bucket-size 5000 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "dp 2 with overlapped buckets: $(cat "$scratch/out")"
# Megatron's --rampup-batch-size: the global batch grows 2, 4 over 4 samples, then the plan's 6;
# the banner says so and each log line names its batch.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --world-size 2 --mbs 1 --gbs 6 --rampup-batch-size 2 2 4 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 4 --log-interval 1
grep -q '96.0 tokens per iteration after a ramp: a global batch of 2, 2 more per step over 4 samples, 4 iterations (288.0 tokens' "$scratch/out" ||
  fail "the ramp's banner: $(cat "$scratch/out")"
[ "$(grep -o 'global batch [246]$' "$scratch/out" | tr '\n' ' ')" = "global batch 2 global batch 4 global batch 6 global batch 6 " ] ||
  fail "the ramp's batches: $(cat "$scratch/out")"
if grep -q 'not modelled.*rampup' "$scratch/err"; then fail "train lists its ramp as not modelled"; fi
expect_error 'error: --rampup-batch-size: every batch of the ramp must be a multiple of micro-batch size x data-parallel size 2, and 3 is not \(3 % 2 = 1\)' \
  train --device cpu --model "$examples/models/tiny-gpt.json" --world-size 2 --mbs 1 --gbs 6 --rampup-batch-size 3 3 2 --data-path "$scratch/corpus_text_document" --train-iters 2
expect_error 'error: --overlap-param-gather: needs --use-distributed-optimizer' train --device cpu --model "$examples/models/tiny-gpt.json" --world-size 2 --overlap-param-gather --data-path "$scratch/corpus_text_document" --train-iters 2
expect_error 'error: --ddp-bucket-size: must be non-negative' train --device cpu --model "$examples/models/tiny-gpt.json" --ddp-bucket-size -1 --data-path "$scratch/corpus_text_document" --train-iters 2
expect_error 'error: --recompute-method: needs --recompute-granularity full' train --device cpu --model "$examples/models/tiny-gpt.json" --recompute-method block --data-path "$scratch/corpus_text_document" --train-iters 2
expect_error 'error: --recompute-num-layers: must be between 1 and the 2 layers of a model chunk, got 3' train --device cpu --model "$examples/models/tiny-gpt.json" --recompute-granularity full --recompute-num-layers 3 --data-path "$scratch/corpus_text_document" --train-iters 2
# Context parallelism: two ranks each hold two chunks of every sequence (ring attention on the CPU).
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --world-size 2 --cp 2 --data-path "$scratch/corpus_text_document" --train-iters 2
grep -q 'tp 1, pp 1, cp 2, dp 1' "$scratch/out" && grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "train at cp 2: $(cat "$scratch/out")"
expect_error 'error: --context-parallel-size: needs --seq-length divisible by 2\*cp = 4 \(6 % 4 = 2\)' train --device cpu --model "$examples/models/tiny-gpt.json" --world-size 2 --cp 2 --seq-length 6 --data-path "$scratch/corpus_text_document" --train-iters 2
# A plan whose world differs from the launcher's (a cp plan).
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$megaplan" train --device cpu --model "$examples/models/tiny-gpt.json" \
  --world-size 2 --cp 2 --data-path "$scratch/corpus_text_document" --train-iters 2 >"$scratch/out" 2>"$scratch/err"
[ $? -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] &&
  grep -q 'error: --world-size: the plan has 2 ranks but torchrun started 1' "$scratch/err" ||
  fail "train under a launcher of another world size: $(cat "$scratch/err")"
# One process per GPU: the CPU backend's ranks are threads of one process, so a launched world of
# several is refused; a launched world of several needs rank 0's address, checked before any GPU.
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 "$megaplan" train --device cpu --model "$examples/models/tiny-gpt.json" \
  --data-path "$scratch/corpus_text_document" --train-iters 2 >"$scratch/out" 2>"$scratch/err"
[ $? -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] &&
  grep -q 'error: --device: torchrun started 2 processes, but the CPU backend runs every rank as a thread' "$scratch/err" ||
  fail "train --device cpu under a launcher of 2: $(cat "$scratch/err")"
# (srun's world bootstraps over the TCP rendezvous; mpirun's goes over MPI where megaplan has it.)
env -u MASTER_ADDR -u MASTER_PORT SLURM_PROCID=0 SLURM_NTASKS=2 SLURM_LOCALID=0 SLURM_TASKS_PER_NODE=2 \
  "$megaplan" train --device cuda --model "$examples/models/tiny-gpt.json" \
  --data-path "$scratch/corpus_text_document" --train-iters 2 >"$scratch/out" 2>"$scratch/err"
[ $? -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] &&
  grep -q 'error: MASTER_ADDR: srun started 2 processes but MASTER_ADDR is not set' "$scratch/err" ||
  fail "train under srun -n 2 without MASTER_ADDR: $(cat "$scratch/err")"
# A launched rank checks its options before it joins a world (whose timeout comes from them).
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "$megaplan" train --device cuda --model "$examples/models/tiny-gpt.json" \
  --data-path "$scratch/corpus_text_document" --train-iters 2 --distributed-timeout-minutes 0 >"$scratch/out" 2>"$scratch/err"
[ $? -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] &&
  grep -q 'error: --distributed-timeout-minutes: must be a positive integer, got 0' "$scratch/err" ||
  fail "a launched train with --distributed-timeout-minutes 0: $(cat "$scratch/err")"
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --num-layers 1 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --mbs 1 --gbs 2 --log-interval 1 --log-file "$scratch/train.jsonl"
grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "train prints no iteration line: $(cat "$scratch/out")"
[ "$(wc -l <"$scratch/train.jsonl")" -eq 2 ] || fail "train --log-file holds no line per iteration"
grep -q '"grad_norm"' "$scratch/train.jsonl" || fail "train --log-file lacks grad_norm"
expect_error 'error: --data-path: .*nowhere.idx: cannot open' train --device cpu --model "$examples/models/tiny-gpt.json" --data-path "$scratch/nowhere" --train-iters 2
# The sample indexes: beside the data by default, else in --data-cache-path; built once and reused,
# rebuilt when the data is prepared again; a folder that cannot be written and a damaged index are
# refused in one line.
ls "$scratch/corpus_text_document/cache/GPTDataset_indices/"*-GPTDataset-train-indices.bin >/dev/null ||
  fail "train cached no sample index beside the data"
cached=(--device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --num-layers 1 --mbs 1
  --gbs 2 --split 1,0,0 --train-iters 1 --data-path "$scratch/cached_text_document")
expect_ok data prepare --input "$scratch/docs.jsonl" --output-prefix "$scratch/cached" --append-eod
expect_ok train "${cached[@]}" --data-cache-path "$scratch/indexes"
grep -q "^built the index of the train samples of $scratch/cached_text_document in [0-9.]* s: $scratch/indexes/[0-9a-f]*-GPTDataset-train-indices.bin$" "$scratch/out" ||
  fail "train says where it built the sample index: $(cat "$scratch/out")"
expect_ok train "${cached[@]}" --data-cache-path "$scratch/indexes" --num-dataset-builder-threads 1
grep -q "^loaded the index of the train samples of $scratch/cached_text_document: $scratch/indexes/" "$scratch/out" ||
  fail "a second run reuses the sample index: $(cat "$scratch/out")"
printf '{"text": "other"}\n{"text": "words"}\n' >"$scratch/other.jsonl"  # as many documents, other tokens
expect_ok data prepare --input "$scratch/other.jsonl" --output-prefix "$scratch/cached" --append-eod
expect_ok train "${cached[@]}" --data-cache-path "$scratch/indexes"
grep -q "^rebuilt the index of the train samples of .* (stale: .*cached_text_document.bin's size or modification time changed since it was built) in " "$scratch/out" ||
  fail "a stale sample index is rebuilt: $(cat "$scratch/out")"
index=$(ls "$scratch/indexes/"*-GPTDataset-train-indices.bin)
truncate -s -1 "$index"
expect_error "error: --data-cache-path: $index: truncated: .*: the cached index is damaged; delete it to build it again" train "${cached[@]}" --data-cache-path "$scratch/indexes"
rm "$index"
expect_error "error: --data-cache-path: $scratch/docs.jsonl/indexes: cannot create the cache folder \(Not a directory\): give --data-cache-path a writable folder" train "${cached[@]}" --data-cache-path "$scratch/docs.jsonl/indexes"
[ ! -e "$scratch/indexes/$(basename "$index")" ] || fail "a refused run wrote a sample index"
expect_error 'error: --num-dataset-builder-threads: must be at least 1, got 0' train "${cached[@]}" --num-dataset-builder-threads 0
# A folder without write permission: as root, the run drops the power to override it.
mkdir "$scratch/readonly"
chmod 555 "$scratch/readonly"
privileged=$megaplan
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  printf '#!/bin/sh\nexec setpriv --bounding-set=-dac_override,-dac_read_search --inh-caps=-dac_override,-dac_read_search "%s" "$@"\n' \
    "$megaplan" >"$scratch/unprivileged"
  chmod +x "$scratch/unprivileged"
  megaplan=$scratch/unprivileged
fi
if [ "$(id -u)" -ne 0 ] || [ "$megaplan" != "$privileged" ]; then
  expect_error "error: --data-cache-path: $scratch/readonly is not writable \(Permission denied\) and the index of the train samples of $scratch/cached_text_document must be built; give --data-cache-path a writable folder" train "${cached[@]}" --data-cache-path "$scratch/readonly"
fi
megaplan=$privileged
# The vocabulary: --vocab-size's, else the named tokenizer's, else the data's largest id plus one.
expect_error 'error: --vocab-size: .*corpus_text_document.bin holds the token id 256, outside the vocabulary of 256 from --vocab-size: give a vocabulary of at least 257' train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 256 --seq-length 16 --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --seq-length 16 --num-layers 1 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --mbs 1 --gbs 1
grep -q '^vocabulary 257 from the data (the largest token id in .*corpus_text_document.bin, plus one; .*) (the model .* states 256)$' "$scratch/out" ||
  fail "train's vocabulary from the data: $(cat "$scratch/out")"
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --seq-length 16 --num-layers 1 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --mbs 1 --gbs 1 --tokenizer hf \
  --tokenizer-file "$hf_tiny/llama3-style/tokenizer.json"
grep -q '^vocabulary 266 from the tokenizer (hf: .*llama3-style/tokenizer.json) (the model .* states 256)$' "$scratch/out" ||
  fail "train's vocabulary from the tokenizer: $(cat "$scratch/out")"
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --seq-length 16 --num-layers 1 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --mbs 1 --gbs 1 --tokenizer sentencepiece \
  --tokenizer-model "$spm_tiny/tiny.model"
grep -q '^vocabulary 500 from the tokenizer (sentencepiece: .*tiny.model) ' "$scratch/out" ||
  fail "train's vocabulary from a SentencePiece model: $(cat "$scratch/out")"
expect_error 'error: --global-batch-size: must be divisible by micro-batch-size\*data-parallel-size = 2\*1 = 2' train --device cpu --model "$examples/models/tiny-gpt.json" --data-path "$scratch/corpus_text_document" --train-iters 2 --mbs 2 --gbs 3
expect_error 'error: --lr-decay-style: unknown style "step"' train --device cpu --model "$examples/models/tiny-gpt.json" --data-path "$scratch/corpus_text_document" --train-iters 2 --lr-decay-style step
expect_error 'error: --device: must be cpu or cuda, got "tpu"' train --device tpu --model "$examples/models/tiny-gpt.json" --data-path "$scratch/corpus_text_document" --train-iters 2
expect_error 'error: --micro-batch-size: .* needs [0-9.]+ GiB on pipeline rank 0 \(cpu: .* but [0-9.]+ GiB are available; lower it, or add --recompute-granularity' train --device cpu --model "$examples/models/tiny-gpt.json" --hidden-size 65536 --num-attention-heads 64 --num-layers 64 --data-path "$scratch/corpus_text_document" --train-iters 2
if [ ! -e /dev/nvidia0 ]; then
  expect_error 'error: --device: (no usable CUDA GPU|this megaplan was built without CUDA)' train --device cuda --model "$examples/models/tiny-gpt.json" --data-path "$scratch/corpus_text_document" --train-iters 2
  # Launched, the rank refuses the same way (through the NCCL world, before its backend).
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 expect_error 'error: --device: (no usable CUDA GPU|this megaplan was built without CUDA)' \
    train --device cuda --model "$examples/models/tiny-gpt.json" --data-path "$scratch/corpus_text_document" --train-iters 2
fi
# With a usable GPU, a rank started by `megaplan launch` trains over NCCL (heads of dimension 64,
# as the flash attention kernels take).
if "$megaplan" devices >/dev/null 2>&1; then
  expect_ok launch --nproc-per-node 1 -- train --device cuda --model "$examples/models/tiny-gpt.json" --vocab-size 257 \
    --seq-length 16 --num-layers 1 --hidden-size 128 --num-attention-heads 2 --data-path "$scratch/corpus_text_document" \
    --split 1,0,0 --train-iters 2 --mbs 1 --gbs 2 --log-interval 1 --distributed-timeout-minutes 1
  [ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "launch -- train --device cuda: $(cat "$scratch/out" "$scratch/err")"
fi

# Search: a small space end to end; the best plan as a job file that simulate reads back; JSON;
# Megatron's arguments; the explanation.
expect_ok search --model gpt2-350m --cluster dgx-a100-80gb --gpus 8 --gbs 16 --pp 1,2 --cp 1 --top 3 --threads 2 \
  --explain --emit megatron --out "$scratch/best.json"
grep -qE '^ ?1(,[0-9]+)* +[0-9]+ ' "$scratch/out" || fail "search prints no ranked plan: $(cat "$scratch/out")"
grep -q 'Why #1 beats #2' "$scratch/out" || fail "search --explain says nothing"
grep -q '^--num-layers 24 .* --tensor-model-parallel-size ' "$scratch/out" || fail "search --emit megatron prints no arguments"
grep -q ' simulated; ' "$scratch/out" || fail "search prints no counts"
expect_ok simulate --plan "$scratch/best.json"
# train --report needs GPUs to simulate on, and says so before training.
expect_error 'error: --report: needs the GPUs to simulate the plan on' train --device cpu \
  --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --data-path "$scratch/corpus_text_document" --train-iters 2 \
  --report "$scratch/nothing.html"
expect_error 'error: --cluster: ' train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 \
  --seq-length 16 --data-path "$scratch/corpus_text_document" --train-iters 2 --report "$scratch/nothing.html" --cluster no-such-cluster
[ ! -e "$scratch/nothing.html" ] || fail "a refused train --report left a report behind"
expect_error 'error: --world-size: 4 differs from the 8 GPUs .*best.json lays the model over' train --device cpu --plan "$scratch/best.json" --world-size 4 --data-path "$scratch/corpus_text_document" --train-iters 2
expect_ok simulate --plan "$scratch/best.json" --num-layers 12 --gbs 32
grep -q 'gbs 32' "$scratch/out" || fail "simulate --plan best.json --gbs 32 did not take the flag: $(head -1 "$scratch/out")"
expect_ok search --model gpt2-350m --cluster dgx-a100-80gb --gpus 16 --gbs 16 --pp 2 --cp 1 --top 1 --threads 2 \
  --emit launch --out "$scratch/best16.json"
for line in "^NCCL_NVLS_ENABLE=0 torchrun --nnodes 2 --nproc-per-node 8 --node-rank \\\$NODE_RANK .* --no-python megaplan train --plan $scratch/best16.json --device cuda" \
  "^megaplan launch --nnodes 2 --nproc-per-node 8 .* -- train --plan $scratch/best16.json" \
  "srun --nodes 2 --ntasks-per-node 8 --gpus-per-node 8 megaplan train --plan" "^mpirun -np 16 --npernode 8 "; do
  grep -q -- "$line" "$scratch/out" || fail "search --emit launch prints no line matching $line: $(cat "$scratch/out")"
done
expect_error 'error: --plan: cannot be combined with --tokenizer' train --plan "$scratch/best16.json" --tokenizer byte --data-path "$scratch/corpus_text_document" --train-iters 1
# train refuses plan flags beside --plan: the overlaps travel in the job file's implementation options.
! grep -q -- '--plan .*--overlap-grad-reduce' "$scratch/out" || fail "search --emit launch passes a flag beside --plan"
grep -q '"overlap_grad_reduce": true' "$scratch/best16.json" || fail "the job file holds the overlap the launch assumes"
# The layout a search chose trains as planned, from its job file: here tp 2 with sequence
# parallelism over 4 ranks, as threads on the CPU.
expect_ok search --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --cluster dgx-a100-80gb \
  --gpus 4 --gbs 8 --cp 1 --tp 2 --sequence-parallel --top 1 --threads 2 --out "$scratch/tiny-best.json"
expect_ok train --device cpu --plan "$scratch/tiny-best.json" --data-path "$scratch/corpus_text_document" --split 1,0,0 \
  --train-iters 2 --log-interval 1
[ "$(grep -c '^iteration [12]/2 | loss ' "$scratch/out")" -eq 2 ] || fail "the searched plan did not train: $(cat "$scratch/out")"
expect_ok search --model gpt2-350m --cluster dgx-a100-80gb --gpus 8 --gbs 16 --tp 2 --pp 2 --json
for key in plans counts iteration_time_s model_tflops_per_gpu mfu bubble_fraction peak_memory_bytes fits_in_memory \
  tensor_parallel_size pruned_by_bound simulated; do
  grep -q "\"$key\"" "$scratch/out" || fail "search --json has no $key"
done
expect_error 'error: --tensor-model-parallel-size: must divide --num-attention-heads 16' search --model gpt2-350m --cluster dgx-a100-80gb --gpus 8 --tp 3
expect_error 'error: --global-batch-size: 1537 is not divisible by any data-parallel size' search --model gpt3-175b --gpus 1024 --gbs 1537 --tp 8 --pp 16 --cp 1
expect_error 'error: --gpus: 65536 GPUs exceed cluster dgx-a100-80gb' search --gpus 65536
expect_error 'error: --memory-fraction: no layout fits in .* the closest, .* more' search --model gpt3-175b --gpus 8 --gbs 8 --cp 1 --out "$scratch/never-best.json"
[ ! -e "$scratch/never-best.json" ] || fail "a failed search wrote --out"
expect_error 'error: --emit: knows "megatron", "torchtitan" and "launch"' search --model gpt2-350m --cluster dgx-a100-80gb --gpus 8 --gbs 16 --emit deepspeed

# Launch: one node's ranks as torchrun starts them; a failing rank is named and its code returned.
expect_ok launch --nproc-per-node 2 -- presets
[ "$(grep -c '^gpt2-124m' "$scratch/out")" -eq 2 ] || fail "launch --nproc-per-node 2 -- presets did not run presets twice"
# Ranks within the input limits, and no more training ranks than the node has GPUs (issue 42).
expect_error 'error: --nproc-per-node: must be at most 1024 \(more than any node\), got 100000' \
  launch --nproc-per-node 100000 -- presets
expect_error 'error: --nproc-per-node: 1000 ranks of `train` on GPUs take one each, and this node shows [0-9]+' \
  launch --nproc-per-node 1000 -- train --model gpt2-124m --data-path /nowhere
expect_error 'error: --nproc-per-node: must be at least 1, got 0' launch --nproc-per-node 0 -- presets
expect_error 'error: --master-addr: --nnodes 2 needs rank 0.s host' launch --nnodes 2 --node-rank 1 -- presets
expect_error 'error: --node-rank: must be in 0..1 for --nnodes 2, got 2' launch --nnodes 2 --node-rank 2 --master-addr 10.0.0.1 -- presets
expect_error 'error: command: nothing after `--`' launch --nproc-per-node 2
"$megaplan" launch --nproc-per-node 2 -- describe --model no-such-model >"$scratch/out" 2>"$scratch/err"
code=$?
[ "$code" -eq 2 ] || fail "launch of a failing describe: exit code $code, want the rank's 2"
grep -qE '^megaplan: launch: rank [01] \(pid [0-9]+\) exited with status 2' "$scratch/err" ||
  fail "launch does not name the failing rank: $(cat "$scratch/err")"
[ "$(grep -c '^megaplan: launch:' "$scratch/err")" -eq 1 ] || fail "launch printed more than one line of its own: $(cat "$scratch/err")"

# A Megatron user's habits (issue 17): train names no default model; a V schedule implies vpp 2; a
# Hugging Face config's long position table and a defaulted global batch are said, not silent.
expect_error 'error: --model: train needs a model' train --device cpu --data-path "$scratch/corpus_text_document" --train-iters 1
expect_ok simulate --model gpt2-124m --cluster h200-x2 --pp 2 --schedule zbv --gbs 8
grep -q 'vpp 2, mbs 1, gbs 8, .*zbv' "$scratch/out" || fail "--schedule zbv did not imply vpp 2: $(head -1 "$scratch/out")"
sed 's/"max_position_embeddings": 8192/"max_position_embeddings": 131072/' "$examples/hf/llama3-8b-config.json" \
  >"$scratch/llama31-config.json"
expect_ok describe --model "$scratch/llama31-config.json" --cluster h200-x2 --tp 2
grep -q "^note: the sequence length 131072 is .*llama31-config.json's max_position_embeddings; pass --seq-length" \
  "$scratch/err" || fail "a 131072-token position table planned silently: $(cat "$scratch/err")"
grep -q '^note: --gbs not given: the global batch is 1 (mbs 1 x dp 1' "$scratch/err" ||
  fail "the defaulted global batch is not said: $(cat "$scratch/err")"
expect_ok describe --model "$scratch/llama31-config.json" --cluster h200-x2 --tp 2 --seq-length 8192 --gbs 8
[ ! -s "$scratch/err" ] || fail "notes without cause: $(cat "$scratch/err")"

# Mixture of experts (issue 40): a Mixtral config, even named "mistral", is described with its
# experts, never as a dense Llama (issue 42's finding 1); what costs or runs it refuses it in one
# line; the experts' flags are checked.
sed 's/"model_type": "llama"/"model_type": "mistral", "num_local_experts": 8, "num_experts_per_tok": 2/; s/LlamaForCausalLM/MistralForCausalLM/' \
  "$examples/hf/llama3-8b-config.json" >"$scratch/mixtral-config.json"
expect_ok describe --model "$scratch/mixtral-config.json" --cluster h200-x2 --seq-length 4096 --gbs 8
grep -q '^experts  8 a layer of ffn 14336, each token to its top 2; ' "$scratch/out" ||
  fail "a Mixtral config named mistral is not described with its experts: $(head -5 "$scratch/out")"
expect_ok describe --model "$examples/hf/mixtral-8x7b-config.json" --cluster h200-x2 --seq-length 4096 --gbs 8 --json
grep -q '"active_parameters": 12879925248' "$scratch/out" || fail "Mixtral-8x7B's active parameters: $(grep -m2 parameters "$scratch/out")"
# simulate costs MoE layers where train runs them (tp and cp 1, megaplan's implementation), at the
# load --moe-imbalance states; search does not enumerate them yet.
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --ep 8 --pp 4 --gbs 64 --seq-length 4096 \
  --recompute-granularity selective --json
balanced_s=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iteration_time_s"])' "$scratch/out")
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --ep 8 --pp 4 --gbs 64 --seq-length 4096 \
  --recompute-granularity selective --moe-imbalance 2 --json
python3 -c 'import json,sys; skewed = json.load(open(sys.argv[1]))["iteration_time_s"]; assert skewed > 1.2 * float(sys.argv[2]), (skewed, sys.argv[2])' \
  "$scratch/out" "$balanced_s" || fail "an expert twice as busy did not slow the ep 8 iteration"
expect_error 'error: --moe-imbalance: must be at most --num-experts / --moe-router-topk = 4 ' \
  simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --ep 8 --gbs 64 --moe-imbalance 5
expect_error 'error: --moe-imbalance: needs --num-experts' simulate --model llama3-8b --cluster dgx-h100 --gpus 8 --moe-imbalance 2
expect_error 'error: --sequence-parallel: mixture of experts under tensor parallelism without sequence parallelism is not in the executor yet' \
  simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 8 --tp 8 --gbs 8 --seq-length 4096
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --sequence-parallel --ep 8 --gbs 64 --seq-length 4096
# Megatron's --expert-tensor-parallel-size: the experts cut over tp (its default) or whole (1).
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --etp 2 --sequence-parallel --ep 8 --gbs 64
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --etp 1 --sequence-parallel --ep 8 --gbs 64
grep -q '^mixtral-8x7b on 16 .*ep 8, etp 1,' "$scratch/out" || fail "simulate --etp 1 names etp: $(head -1 "$scratch/out")"
expect_ok simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --etp 4 --sequence-parallel --ep 4 --gbs 64
grep -q '^mixtral-8x7b on 16 .*ep 4, etp 4,' "$scratch/out" || fail "simulate --etp 4 names etp: $(head -1 "$scratch/out")"
expect_error 'error: --expert-tensor-parallel-size: needs --num-experts' simulate --model llama3-8b --cluster dgx-h100 --gpus 16 --etp 1
expect_error 'error: --expert-tensor-parallel-size: times --expert-model-parallel-size must divide the ranks of a pipeline stage' \
  simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 16 --tp 2 --etp 1 --sequence-parallel --ep 8 --pp 4 --gbs 64
# search tries the experts whole and cut over tp; --etp lists the sizes it may take.
expect_ok search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 256 --tp 2 --ep 8 --etp 1 --top 3
grep -q ' etp ' "$scratch/out" || fail "search --etp 1 prints the etp column: $(cat "$scratch/out")"
expect_ok search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 256 --tp 2 --ep 8 --etp 1 --top 1 --emit megatron
grep -q -- '--expert-tensor-parallel-size 1' "$scratch/out" || fail "--emit megatron prints etp: $(cat "$scratch/out")"
expect_error "error: --num-experts: mixture of experts is costed as megaplan's executor runs it; Megatron-LM's \(megatron-core\)" \
  simulate --model mixtral-8x7b --cluster dgx-h100 --gpus 8 --ep 8 --gbs 8 --implementation megatron-core
# search ranks MoE layouts over ep where megaplan's executor runs them (tp and cp 1), at the stated
# load; --emit megatron prints Megatron's MoE flags; Megatron-LM's MoE layers and torchtitan's are refused.
expect_ok search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 256 --seq-length 4096 --top 3 --threads 2 \
  --moe-imbalance 1.5 --emit megatron --json
python3 -c '
import json, sys
result = json.load(open(sys.argv[1]))
for plan in result["plans"]:
    # Where train runs MoE layers: tp only with sequence parallelism (cp of any size).
    assert plan["tensor_parallel_size"] == 1 or plan["sequence_parallel"], plan
    assert plan["moe_imbalance"] == 1.5, plan
arguments = " ".join(result["megatron_arguments"])
assert "--num-experts 8" in arguments and "--moe-router-topk 2" in arguments, arguments
ep = result["plans"][0].get("expert_model_parallel_size", 1)
assert ep == 1 or "--expert-model-parallel-size %d" % ep in arguments, arguments
' "$scratch/out" || fail "search of Mixtral-8x7B: $(head -c 600 "$scratch/out")"
expect_ok search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 256 --seq-length 4096 --top 3 --threads 2
grep -q '^#  *tp  *pp  *dp  *cp  *ep  *vpp' "$scratch/out" || fail "search's table has no ep column: $(head -5 "$scratch/out")"
expect_error "error: --num-experts: mixture of experts is costed as megaplan's executor runs it; Megatron-LM's \(megatron-core\)" \
  search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 64 --seq-length 4096 --implementation megatron-core
expect_error "error: --emit: torchtitan has no model of mixtral-8x7b's kind" \
  search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 64 --seq-length 4096 --emit torchtitan
expect_error 'error: --expert-model-parallel-size: must divide --num-experts 8' \
  search --model mixtral-8x7b --cluster dgx-h100 --gpus 64 --gbs 64 --seq-length 4096 --ep 3
mkdir -p "$scratch/mixtral-hf" && cp "$examples/hf/mixtral-8x7b-config.json" "$scratch/mixtral-hf/config.json"
# convert reads a Mixtral's experts now (tests/executor/io/hf_checkpoint_test.cc round-trips them);
# a directory with its config and no weights is refused naming the file, nothing written.
expect_error 'error: --load: .*/mixtral-hf/model.safetensors: cannot read' \
  convert --to megaplan --load "$scratch/mixtral-hf" --save "$scratch/never-mixtral"
[ ! -e "$scratch/never-mixtral" ] || fail "a refused conversion left $scratch/never-mixtral"
# Mixtral-8x7B's experts are priced before anything is allocated: far more than this machine holds.
expect_error 'error: --micro-batch-size: mixtral-8x7b with micro-batch size 1 needs [0-9.]+ GiB on pipeline rank 0' \
  train --device cpu --model mixtral-8x7b --seq-length 16 --data-path "$scratch/corpus_text_document" --train-iters 1
expect_error 'error: --moe-router-topk: must lie in \[1, --num-experts\] = \[1, 8\], got 9' \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-router-topk 9
expect_error 'error: --num-experts: must be at least 1, got 0 \(leave it out for a dense model\)' \
  describe --model llama3-8b --cluster h200-x2 --num-experts 0
expect_error 'error: --moe-ffn-hidden-size: needs --num-experts' describe --model llama3-8b --cluster h200-x2 --moe-ffn-hidden-size 512
expect_ok describe --model mixtral-8x7b --cluster dgx-h100 --gpus 8 --ep 8 --seq-length 4096 --gbs 8
grep -q 'ep 8 (each GPU holds its tp shard of 1 expert a layer)' "$scratch/out" || fail "describe --ep 8: $(sed -n 5p "$scratch/out")"
expect_error 'error: --expert-model-parallel-size: must divide --num-experts 8' describe --model mixtral-8x7b --cluster dgx-h100 --gpus 6 --ep 3
expect_error 'error: --expert-model-parallel-size: needs --num-experts' describe --model llama3-8b --cluster h200-x2 --ep 2
expect_error 'error: --expert-model-parallel-size: needs --num-experts' search --model llama3-8b --cluster h200-x2 --ep 2
# The router's and the layer pattern's flags (Megatron's), described; Megatron's rules refused in one line.
expect_ok describe --model mixtral-8x7b --cluster h200-x2 --seq-length 4096 --gbs 8 --moe-layer-freq '([1]*3+[0])*8' \
  --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-aux-loss-coeff 0.01 \
  --moe-expert-capacity-factor 1.25 --moe-token-drop-policy position
grep -q '^router   in 24 of 32 layers .*sigmoid after the top k, expert bias (rate 0.001); aux_loss x 0.01, z loss x 0; capacity factor 1.25 (position drop policy)$' \
  "$scratch/out" || fail "describe's router line: $(grep '^router' "$scratch/out")"
expect_ok describe --model "$examples/hf/qwen1.5-moe-a2.7b-config.json" --cluster h200-x2 --seq-length 4096 --gbs 8 --json
grep -q '"active_parameters": 2689173504' "$scratch/out" || fail "Qwen1.5-MoE-A2.7B's active parameters: $(grep -m2 parameters "$scratch/out")"
expect_error 'error: --moe-layer-freq: the pattern names 4 layers; the model has 32' \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-layer-freq '[1,0,1,0]'
expect_error "error: --moe-layer-freq: must be an integer or a list pattern such as \(\[1\]\*3\+\[0\]\)\*2: expected a number" \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-layer-freq '[os]'
expect_error 'error: --moe-router-enable-expert-bias: needs --moe-router-score-function sigmoid' \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-router-enable-expert-bias
expect_error 'error: --moe-router-load-balancing-type: sinkhorn balancing is not modelled' \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-router-load-balancing-type sinkhorn
expect_error 'error: --moe-expert-capacity-factor: must be positive, got 0.0' \
  describe --model mixtral-8x7b --cluster h200-x2 --moe-expert-capacity-factor 0
expect_error 'error: --moe-aux-loss-coeff: needs --num-experts' describe --model llama3-8b --cluster h200-x2 --moe-aux-loss-coeff 0.01
expect_ok simulate --model "$examples/hf/qwen1.5-moe-a2.7b-config.json" --cluster h200-x2 --seq-length 4096 --ep 2
# Qwen3-MoE: each query and key head normalised (--qk-layernorm), 128 experts of 768, the top 8 renormalised.
expect_ok describe --model "$examples/hf/qwen3-30b-a3b-config.json" --cluster dgx-h100 --gpus 8 --seq-length 4096 --gbs 8 --json
grep -q '"active_parameters": 3353032704' "$scratch/out" || fail "Qwen3-30B-A3B's active parameters: $(grep -m2 parameters "$scratch/out")"
grep -q '"qk_layernorm": true' "$scratch/out" || fail "Qwen3-30B-A3B's query and key norms: $(grep -m1 qk "$scratch/out")"
expect_ok simulate --model qwen3-30b-a3b --cluster dgx-h100 --gpus 8 --gbs 64 --tp 2 --sequence-parallel --ep 4
expect_ok search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --gbs 64 --top 3 --threads 2 --emit megatron
grep -q -- '--qk-layernorm' "$scratch/out" || fail "search --emit megatron drops --qk-layernorm"
expect_error 'error: --qk-layernorm: is modelled with --normalization RMSNorm only' \
  describe --model gpt2-124m --cluster h200-x2 --qk-layernorm
# With query and key norms a Llama 3 is torchtitan's qwen3 kind, no flavour of its: a comment says which.
expect_ok search --model llama3-8b --cluster dgx-h100 --gpus 8 --gbs 64 --qk-layernorm --top 1 --threads 2 --emit torchtitan
grep -q 'from torchtitan.models.qwen3.config_registry import qwen3_32b' "$scratch/out" &&
  grep -q '# torchtitan has no flavour of llama3-8b: add one to qwen3_configs' "$scratch/out" ||
  fail "search --emit torchtitan: query and key norms are not qwen3's: $(tail -30 "$scratch/out")"
# A tiny Qwen3 trains at tp 2 on the CPU backend and exports as qwen3.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 \
  --normalization RMSNorm --swiglu --position-embedding-type rope --num-query-groups 2 --kv-channels 16 --qk-layernorm \
  --untie-embeddings-and-output-weights --disable-bias-linear --world-size 2 --tp 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --save "$scratch/qwen3-ckpt"
expect_ok convert --to hf --load "$scratch/qwen3-ckpt" --save "$scratch/qwen3-hf"
grep -q '"model_type": "qwen3"' "$scratch/qwen3-hf/config.json" || fail "convert --to hf: $(cat "$scratch/qwen3-hf/config.json")"
# A weight that is not finite is refused naming the tensor (issue 42), nothing written.
cp -r "$scratch/qwen3-hf" "$scratch/nan-hf"
python3 - "$scratch/nan-hf/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
length = struct.unpack("<Q", data[:8])[0]
begin = 8 + length + json.loads(data[8:8 + length])["model.layers.0.mlp.down_proj.weight"]["data_offsets"][0]
data[begin:begin + 4] = struct.pack("<f", float("nan"))
open(path, "wb").write(data)
PY
expect_error "error: --load: .*nan-hf/model.safetensors: tensor model.layers.0.mlp.down_proj.weight holds NaN at element [0-9]+: weights must be finite" \
  convert --to megaplan --load "$scratch/nan-hf" --save "$scratch/never-nan"
[ ! -e "$scratch/never-nan" ] || fail "a refused conversion left $scratch/never-nan"
# A refused --load says so in one line and prints nothing on stdout (issue 42): a corrupted shard.
cp -r "$scratch/qwen3-ckpt" "$scratch/corrupt-ckpt"
printf 'XXXXXXXX' | dd of="$scratch/corrupt-ckpt/iter_0000002/mp_rank_00/model.bin" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_error 'error: --load: .*/corrupt-ckpt/iter_0000002/mp_rank_00/model.bin: checksum of .* does not match its manifest' \
  train --device cpu --model "$scratch/qwen3-hf/config.json" --seq-length 16 --world-size 2 --tp 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 3 --load "$scratch/corrupt-ckpt"
# A rank directory in another's place, a byte appended to a shard (issue 42): each refused in one line.
cp -r "$scratch/qwen3-ckpt" "$scratch/swapped-ckpt"
(cd "$scratch/swapped-ckpt/iter_0000002" && mv mp_rank_00 swap && mv mp_rank_01 mp_rank_00 && mv swap mp_rank_01)
expect_error 'error: --load: .*/swapped-ckpt/iter_0000002/mp_rank_00/manifest.json: directory: saved as "mp_rank_01", but it lies in mp_rank_00' \
  train --device cpu --model "$scratch/qwen3-hf/config.json" --seq-length 16 --world-size 2 --tp 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 3 --load "$scratch/swapped-ckpt"
cp -r "$scratch/qwen3-ckpt" "$scratch/longer-ckpt"
printf 'X' >> "$scratch/longer-ckpt/iter_0000002/mp_rank_01/model.bin"
expect_error 'error: --load: .*/longer-ckpt/iter_0000002/mp_rank_01/model.bin holds [0-9]+ bytes, its manifest.s tensors [0-9]+' \
  convert --to hf --load "$scratch/longer-ckpt" --save "$scratch/never-longer"
# Without latest_checkpointed_iteration.txt an incomplete newer iteration is passed over, said so;
# a state.json linked to a device or a loop of links is refused in one line (issue 42).
cp -r "$scratch/qwen3-ckpt" "$scratch/fallback-ckpt"
rm "$scratch/fallback-ckpt/latest_checkpointed_iteration.txt"
mkdir "$scratch/fallback-ckpt/iter_0000003"
cp "$scratch/fallback-ckpt/iter_0000002/state.json" "$scratch/fallback-ckpt/iter_0000003/"
expect_ok train --device cpu --model "$scratch/qwen3-hf/config.json" --seq-length 16 --world-size 2 --tp 2 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 3 --load "$scratch/fallback-ckpt"
grep -qF "passed over incomplete $scratch/fallback-ckpt/iter_0000003 (no mp_rank_00/manifest.json)" "$scratch/out" ||
  fail "the incomplete iteration was not named"
grep -q "loaded $scratch/fallback-ckpt at iteration 2" "$scratch/out" || fail "iteration 2 was not loaded"
rm "$scratch/fallback-ckpt/iter_0000002/state.json"
ln -s /dev/zero "$scratch/fallback-ckpt/iter_0000002/state.json"
rm -r "$scratch/fallback-ckpt/iter_0000003"
expect_error 'error: --load: .*/fallback-ckpt/iter_0000002/state.json: is a device, not a regular file' \
  convert --to hf --load "$scratch/fallback-ckpt" --save "$scratch/never-zero"
ln -s loop "$scratch/fallback-ckpt/loop"
ln -s loop "$scratch/fallback-ckpt/latest_checkpointed_iteration.txt"
expect_error 'error: --load: .*/fallback-ckpt/latest_checkpointed_iteration.txt: Too many levels of symbolic links' \
  convert --to hf --load "$scratch/fallback-ckpt" --save "$scratch/never-loop"
# A --save folder another run holds (here flock(1) holds it) is refused before training (issue 42).
mkdir -p "$scratch/held-ckpt"
flock "$scratch/held-ckpt" -c "echo \$\$ > '$scratch/held-pid'; touch '$scratch/held-ready'; exec sleep 60" >/dev/null 2>&1 &
holder=$!
while [ ! -e "$scratch/held-ready" ]; do sleep 0.1; done
expect_error "error: --save: $scratch/held-ckpt is being saved into by another run \\(it holds the folder's lock\\)" \
  train --device cpu --model "$scratch/qwen3-hf/config.json" --seq-length 16 --mbs 1 --gbs 1 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 1 --save "$scratch/held-ckpt"
kill "$(cat "$scratch/held-pid")"  # the lock's holder ends with its command
wait "$holder" 2>/dev/null || true

# Uneven stages: Llama 3.1 405B's 126 layers plan on 1024 H100s with pp >= 8 (issue 17's acceptance),
# and the emitted Megatron arguments carry the split.
expect_ok search --model llama3.1-405b --cluster dgx-h100 --gpus 1024 --gbs 2048 --seq-length 8192 --top 3 --threads 2 \
  --json --emit megatron
python3 -c '
import json, sys
best = json.load(open(sys.argv[1]))["plans"][0]
assert best["pipeline_parallel_size"] >= 8, best
assert best["account_for_embedding_in_pipeline_split"] or best["decoder_first_pipeline_num_layers"] > 0, best
args = " ".join(json.load(open(sys.argv[1]))["megatron_arguments"])
assert "--num-layers 126" in args and ("--account-for-embedding-in-pipeline-split" in args or "--decoder-first-pipeline-num-layers" in args), args
' "$scratch/out" || fail "llama3.1-405b on 1024 H100s: no pp >= 8 plan with an uneven split"
expect_ok simulate --model llama3.1-405b --cluster dgx-h100 --gpus 1024 --gbs 2048 --seq-length 8192 --tp 8 --pp 16 \
  --cp 2 --sequence-parallel --use-distributed-optimizer --decoder-first-pipeline-num-layers 7 \
  --decoder-last-pipeline-num-layers 7
grep -q 'pp 16, cp 2, dp 4, vpp 1 (first 7 last 7)' "$scratch/out" || fail "simulate does not say the uneven split"
expect_error 'error: --decoder-first-pipeline-num-layers: leaves 114 of the 126 layers to the other 14' simulate \
  --model llama3.1-405b --cluster dgx-h100 --gpus 1024 --gbs 2048 --tp 8 --pp 16 --decoder-first-pipeline-num-layers 6 \
  --decoder-last-pipeline-num-layers 6
expect_error 'error: --num-layers: 126 must be divisible by pp\*vpp = 16\*1 = 16; uneven stages' simulate \
  --model llama3.1-405b --cluster dgx-h100 --gpus 1024 --gbs 2048 --tp 8 --pp 16

# search --pick K: the K-th ranked plan to --out; beyond the ranking, one line.
expect_ok search --model gpt2-350m --cluster dgx-a100-80gb --gpus 8 --gbs 16 --pp 1,2 --cp 1 --top 3 --threads 2 --json \
  --pick 2 --out "$scratch/second.json"
python3 -c '
import json, sys
second = json.load(open(sys.argv[1]))["plans"][1]
job = json.load(open(sys.argv[2]))["plan"]
keys = ["tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "micro_batch_size", "schedule", "recompute_granularity"]
assert all(second[k] == job[k] for k in keys), (second, job)
' "$scratch/out" "$scratch/second.json" || fail "search --pick 2 --out did not write the second plan"
expect_error 'error: --pick: must name one of the 3 ranked plans \(1..3\), got 4' search --model gpt2-350m \
  --cluster dgx-a100-80gb --gpus 8 --gbs 16 --pp 1,2 --cp 1 --top 3 --threads 2 --pick 4 --out "$scratch/never.json"
[ ! -e "$scratch/never.json" ] || fail "a refused --pick wrote --out"

# Pasted arguments: Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh, paths made up,
# simulate on 128 A100s as pasted; what megaplan does not model is listed once, paths recorded.
gpt3_script=(--num-layers 96 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048
  --max-position-embeddings 2048 --attention-backend auto
  --micro-batch-size 1 --global-batch-size 1536 --rampup-batch-size 16 16 5859375 --train-iters 500000
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --init-method-std 0.006 --clip-grad 1.0 --fp16
  --lr 6.0e-5 --lr-decay-style cosine --min-lr 6.0e-6 --lr-warmup-fraction .001 --lr-decay-iters 430000
  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 16
  --data-path /made/up/gpt3_text_document --vocab-file /made/up/gpt2-vocab.json --merge-file /made/up/gpt2-merges.txt
  --split 949,50,1
  --log-interval 100 --save-interval 10000 --eval-interval 1000 --save /made/up/ckpt --load /made/up/ckpt
  --eval-iters 10 --tensorboard-dir /made/up/tb)
# The precision flag does not choose the implementation: megaplan's executor runs --fp16 too.
expect_ok simulate --cluster dgx-a100-80gb --gpus 128 "${gpt3_script[@]}"
grep -q '^code       megaplan: fp16' "$scratch/out" || fail "the pasted --fp16 switched the implementation: $(cat "$scratch/out")"
# A model of Megatron's flags alone takes Megatron's argparse dropout, 0.1, unless the flags say otherwise.
grep -q '^code       megaplan: .*; dropout 0.1 attention, 0.1 hidden;' "$scratch/out" ||
  fail "the custom model does not take Megatron's dropout: $(grep '^code' "$scratch/out")"
expect_ok simulate --cluster dgx-a100-80gb --gpus 128 "${gpt3_script[@]}" --hidden-dropout 0 --attention-dropout 0
grep -q '^code       megaplan: .*; dropout 0 attention, 0 hidden;' "$scratch/out" ||
  fail "--hidden-dropout 0 does not override the custom model's default: $(grep '^code' "$scratch/out")"
expect_ok simulate --cluster dgx-a100-80gb --gpus 128 --implementation megatron-core "${gpt3_script[@]}"
grep -q '^custom on 128 x A100-SXM4-80GB: tp 8, pp 16, cp 1, dp 1, .*gbs 1536' "$scratch/out" ||
  fail "the GPT-3 175B script's arguments did not simulate as pasted: $(head -1 "$scratch/out")"
grep -q '^code       megatron-core: fp16' "$scratch/out" || fail "the pasted --fp16 is not modelled"
[ "$(grep -c '^note: training flags' "$scratch/err")" -eq 1 ] || fail "the training flags are not listed once"
grep -q "^note: training flags, no effect on the iteration's cost: --train-iters, --weight-decay, .*--init-method-std, .*--lr-warmup-fraction" "$scratch/err" || fail "training flags: $(cat "$scratch/err")"
grep -q "^note: no effect on the iteration's cost (accepted as Megatron-LM .*): --attention-backend, --tensorboard-dir" "$scratch/err" || fail "cosmetic flags: $(cat "$scratch/err")"
grep -q '^note: --rampup-batch-size: the iteration costed runs the full global batch' "$scratch/err" || fail "the ramp's note: $(cat "$scratch/err")"
grep -q '^note: recorded, not opened: --data-path /made/up/gpt3_text_document' "$scratch/err" || fail "the data path is not recorded"
grep -q "^note: the vocabulary 50257 is GPT2BPETokenizer's" "$scratch/err" || fail "the vocabulary does not come from the tokenizer flags"
# Megatron's model flags alone define a model named custom, with Megatron's required arguments.
expect_error 'error: --max-position-embeddings: required for a model defined by Megatron' simulate --cluster h200-x2 \
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 256
expect_error 'error: --vocab-size: a model defined by Megatron.s flags needs its vocabulary' describe --cluster h200-x2 \
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64
expect_ok describe --cluster h200-x2 --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
  --max-position-embeddings 64 --vocab-size 256
grep -q '^custom on 2 x ' "$scratch/out" || fail "Megatron's model flags alone do not define the custom model: $(head -3 "$scratch/out")"
# Every flag outside the command and Megatron-LM's table is refused; what the command computes is
# refused where megaplan does not implement it; a value megaplan does not run is refused.
expect_error 'error: --foo-bar: is not an argument of this command nor of Megatron-LM' simulate --model gpt2-124m --cluster h200-x2 --foo-bar 1
expect_error 'error: --tensor-parallel-size: .*did you mean --tensor-model-parallel-size\?' simulate --model gpt2-124m --cluster h200-x2 --tensor-parallel-size 2
expect_error 'error: --seq-len: .*did you mean --seq-length\?' describe --model gpt2-124m --cluster h200-x2 --seq-len 512
expect_error 'error: --num-gpus: .*did you mean --gpus\?' search --model gpt2-124m --cluster h200-x2 --num-gpus 2
expect_error 'error: --moe-grouped-gemm: changes the model, the layout or its arithmetic, and megaplan does not implement it: megaplan runs one GEMM per expert \(a grouped GEMM is not built\)' \
  simulate --model mixtral-8x7b --cluster h200-x2 --moe-grouped-gemm
expect_error 'error: --fp8-format: .*FP8/FP4 training is not built yet \(issue 41\)' simulate --model gpt2-124m --cluster h200-x2 --fp8-format hybrid
expect_error 'error: --distributed-backend: megaplan runs only nccl' simulate --model gpt2-124m --cluster h200-x2 --distributed-backend gloo
expect_error 'error: --log-params-norm: takes no value' simulate --model gpt2-124m --cluster h200-x2 --log-params-norm 1
expect_error "error: --weight-decay-incr-style: megaplan runs only constant" \
  simulate --model gpt2-124m --cluster h200-x2 --weight-decay-incr-style linear
expect_error 'error: --loss-scale: must be a finite positive number' train --device cpu \
  --model "$examples/models/tiny-gpt.json" --loss-scale 0 --data-path /nonexistent --train-iters 1
expect_error 'error: --foo-bar: is not an argument' train --device cpu --model "$examples/models/tiny-gpt.json" --foo-bar 1 --data-path /nonexistent --train-iters 1
expect_error 'error: --world-size: world size 2 must be divisible by tp\*pp\*cp' train --device cpu --model "$examples/models/tiny-gpt.json" \
  --world-size 2 --tp 4 --data-path /nonexistent --train-iters 1
expect_error 'error: --pps: is not an argument of `megaplan schedule` \(see megaplan schedule --help\); did you mean --pp\?' \
  schedule --kind 1f1b --pps 2 --microbatches 4
# The planner offers what the implementation runs: megaplan's executor context parallelism among it,
# emitted as Megatron-Core's ring over send and receive; Megatron-LM no zero-bubble or V schedules;
# and launch lines start megaplan.
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --cp 2 --threads 2 --json
python3 -c '
import json, sys
plans = json.load(open(sys.argv[1]))["plans"]
assert plans and all(p["context_parallel_size"] == 2 for p in plans), plans
' "$scratch/out" || fail "search under megaplan does not rank context-parallel plans"
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --cp 2 --threads 2 --emit megatron
grep -q -- "--context-parallel-size 2" "$scratch/out" && grep -q -- "--cp-comm-type p2p" "$scratch/out" &&
  grep -q -- "--transformer-impl transformer_engine" "$scratch/out" ||
  fail "--emit megatron of a cp plan is not Megatron-Core's ring: $(cat "$scratch/out")"
expect_error 'error: --schedule: zbv is not a Megatron-LM schedule' search --model gpt2-124m --cluster h200-x2 --gbs 8 \
  --implementation megatron-core --schedule zbv --threads 2
expect_error 'error: --schedule: dualpipev is not a Megatron-LM schedule' simulate --model gpt2-124m --cluster h200-x2 --pp 2 \
  --gbs 8 --implementation megatron-core --schedule dualpipev
expect_error 'error: --emit: launch prints lines that start megaplan train' search --model gpt2-124m --cluster h200-x2 --gbs 8 \
  --implementation megatron-core --emit launch --threads 2
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --pp 2 --implementation megatron-core --threads 2 --json
python3 -c '
import json, sys
plans = json.load(open(sys.argv[1]))["plans"]
assert {p["schedule"] for p in plans} <= {"1f1b", "interleaved"}, plans
' "$scratch/out" || fail "search under megatron-core ranks schedules Megatron-LM does not have"
expect_ok simulate --model llama3-8b --cluster h200-x2 --gbs 8 --implementation megatron-core
grep -q 'no dropout\|dropout 0 attention, 0 hidden' "$scratch/out" || fail "megatron-core gives the Llama family dropout: $(grep '^code' "$scratch/out")"
expect_ok simulate --model gpt2-124m --cluster h200-x2 --gbs 8 --cp 2
if grep -q "^note: .*context" "$scratch/err"; then fail "simulate of a cp plan notes what megaplan plans: $(cat "$scratch/err")"; fi
# --recompute-activations is Megatron's alias of selective recomputation.
expect_ok describe --model gpt2-124m --cluster h200-x2 --gbs 8 --recompute-activations
grep -q 'selective' "$scratch/out" || fail "--recompute-activations is not selective recomputation: $(cat "$scratch/out")"
# A vocab file that exists gives the vocabulary (its entries).
printf '{"a": 0, "b": 1, "c": 2, "d": 3}' >"$scratch/vocab.json"
: >"$scratch/merges.txt"
expect_ok describe --model gpt2-124m --cluster h200-x2 --gbs 8 --vocab-file "$scratch/vocab.json" --merge-file "$scratch/merges.txt"
grep -q "^note: the vocabulary 4 is .*vocab.json's" "$scratch/err" || fail "the vocab file's entries are not the vocabulary: $(cat "$scratch/err")"
grep -q "recorded, not opened: .*--vocab-file" "$scratch/err" && fail "the vocab file read is said not opened: $(cat "$scratch/err")"
# One that is no vocabulary, or no regular file, is refused (issue 42); one absent here is GPT-2's, said.
printf '{"name": "x", "layers": 3}' >"$scratch/not-vocab.json"
expect_error 'error: --vocab-file: .*not-vocab.json: not a GPT-2 vocabulary: token "layers" has id 3' \
  describe --model gpt2-124m --cluster h200-x2 --gbs 8 --vocab-file "$scratch/not-vocab.json" --merge-file "$scratch/merges.txt"
mkfifo "$scratch/vocab.fifo"
expect_error 'error: --vocab-file: .*vocab.fifo: is a FIFO, not a regular file' \
  describe --model gpt2-124m --cluster h200-x2 --gbs 8 --vocab-file "$scratch/vocab.fifo" --merge-file "$scratch/merges.txt"
expect_error 'error: --input: .*vocab.fifo: is a FIFO, not a regular file' data prepare --input "$scratch/vocab.fifo" \
  --output-prefix "$scratch/never-fifo"
mkfifo "$scratch/model.fifo.json"
expect_error 'error: .*model.fifo.json: is a FIFO, not a regular file' describe --model "$scratch/model.fifo.json" --cluster h200-x2
# argparse's rule: a repeated flag takes its last value; a word without a flag is refused.
expect_ok describe --model gpt2-124m --cluster h200-x2 --tp 2 --tp 1 --gbs 8
grep -q 'tp 1 x pp 1' "$scratch/out" || fail "a repeated --tp did not take its last value: $(grep '^plan' "$scratch/out")"
expect_error 'error: stray: is not an argument megaplan knows' simulate --model gpt2-124m --cluster h200-x2 stray

# search --compare: every schedule and vpp of a pinned layout side by side, those that do not fit too.
expect_ok search --model gpt3-175b --cluster dgx-h100 --gpus 1024 --gbs 1536 --tp 8 --pp 16 --cp 1 --mbs 1 \
  --recompute-granularity none --sequence-parallel --use-distributed-optimizer --compare --threads 2 \
  --memory-fraction 0.4 --json
python3 -c '
import json, sys
plans = json.load(open(sys.argv[1]))["plans"]
schedules = {p["schedule"] for p in plans}
assert schedules == {"1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"}, schedules
assert {p["fits_in_memory"] for p in plans} == {True, False}, plans
times = [p["iteration_time_s"] for p in plans]
assert times == sorted(times), times
' "$scratch/out" || fail "search --compare does not show every schedule, fitting or not"
expect_error 'error: --compare: [0-9]+ layouts match; pin the layout' search --model gpt3-175b --cluster dgx-h100 \
  --gpus 1024 --gbs 1536 --compare --threads 2

# --emit torchtitan: a config module torchtitan runs (--module/--config), run here against
# stand-ins holding exactly torchtitan's config fields, with the plan's degrees and schedule.
check_torchtitan() { python3 "$(dirname "$0")/check_torchtitan_config.py" "$scratch/out" > "$scratch/tt.json" &&
  python3 -c "$1" "$scratch/tt.json" || fail "search --emit torchtitan: $2: $(head -c 800 "$scratch/tt.json")"; }
expect_ok search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --pp 2 --tp 2 --schedule interleaved --top 1 \
  --threads 2 --json --emit torchtitan
check_torchtitan '
import json, sys
got = json.load(open(sys.argv[1]))
plan, config = got["plan"], got["config"]
p, t = config["parallelism"], config["training"]
assert config["registry_config"] == "llama3_8b" and "global_vocab_size" not in config["loss"]["loss_fn"], config
assert p["tensor_parallel_degree"] == 2 and p["pipeline_parallel_degree"] == 2, p
assert p["pipeline_parallel_schedule"] == "Interleaved1F1B", p
assert p["data_parallel_replicate_degree"] * p["data_parallel_shard_degree"] == plan["data_parallel_size"], p
assert p["num_pp_microbatches"] * plan["micro_batch_size"] * plan["data_parallel_size"] == 64, p
assert p["pipeline_parallel_layers_per_stage"] * 2 * plan["virtual_pipeline_parallel_size"] == 32, p
assert t["num_tokens_per_train_step"] == 64 * 8192 and t["max_context_length"] == 8192, t
assert t["num_tokens_per_microbatch_per_dp_rank"] == plan["micro_batch_size"] * 8192, t
' "the module does not carry the plan"
expect_ok search --model llama3-8b --cluster dgx-h100 --gpus 16 --gbs 64 --cp 2 --top 1 --threads 2 --json --emit torchtitan
check_torchtitan '
import json, sys
p = json.load(open(sys.argv[1]))["config"]["parallelism"]
assert p["context_parallel_degree"] == 2 and p["context_parallel_load_balancer"] == "headtail", p
' "a cp plan does not split sequences head and tail as Megatron-Core does"
# Qwen3-MoE: the qwen3 registry config, its flavour where the preset has no config of its own, ep.
expect_ok search --model qwen3-235b-a22b --cluster dgx-h100 --gpus 256 --gbs 512 --ep 8 --etp 1 --top 1 --threads 2 \
  --json --emit torchtitan
check_torchtitan '
import json, sys
got = json.load(open(sys.argv[1]))
config, p = got["config"], got["config"]["parallelism"]
assert config["registry_config"] == "qwen3_30b_a3b" and config["model_spec"] == {"flavour": "235B-A22B"}, config
assert config["loss"]["loss_fn"]["global_vocab_size"] == "the vocabulary of 235B-A22B", config
assert p["expert_parallel_degree"] == 8 and p["data_parallel_shard_degree"] == got["plan"]["data_parallel_size"], p
' "the MoE module does not carry the plan"
expect_error "error: --emit: torchtitan's experts are whole under expert parallelism; this plan's --expert-tensor-parallel-size is 2 \(search with --etp 1\)" \
  search --model qwen3-30b-a3b --cluster dgx-h100 --gpus 16 --gbs 64 --tp 2 --ep 2 --etp 2 --top 1 --threads 2 \
  --emit torchtitan --out "$scratch/never-torchtitan.json"
[ ! -e "$scratch/never-torchtitan.json" ] || fail "search --emit torchtitan wrote --out before refusing the plan"

# simulate --schedule-csv costs an imported torch schedule exactly as the generated one.
expect_ok schedule --kind zbv --pp 4 --microbatches 8 --format csv
cp "$scratch/out" "$scratch/zbv.csv"
zbv_plan=(--model gpt2-350m --cluster dgx-h100 --gpus 8 --pp 4 --tp 2 --schedule zbv --gbs 8 --json)
expect_ok simulate "${zbv_plan[@]}"
generated=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iteration_time_s"])' "$scratch/out")
expect_ok simulate "${zbv_plan[@]}" --schedule-csv "$scratch/zbv.csv"
imported=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["iteration_time_s"])' "$scratch/out")
[ -n "$generated" ] && [ "$generated" = "$imported" ] || fail "an imported zbv CSV simulates to $imported s, --schedule zbv to $generated s"
expect_error 'error: --schedule-csv: .*zbv.csv has 4 pipeline ranks, the plan 2' simulate --model gpt2-350m --cluster dgx-h100 \
  --gpus 8 --pp 2 --tp 2 --schedule zbv --gbs 8 --schedule-csv "$scratch/zbv.csv"

# --exit-signal-handler: SIGTERM mid-run saves at the iteration's end and exits 0, stdout (a file)
# already held the log lines, and the checkpoint loads; SIGINT stops without saving.
signal_run=(train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --pp 2
  --num-layers 4 --mbs 1 --gbs 4 --world-size 2 --data-path "$scratch/corpus_text_document" --split 1,0,0 --eval-iters 0
  --log-interval 1 --exit-signal-handler)
for signal in TERM INT; do
  # The last run's log goes first: read before this run truncates it, its lines would send the
  # signal before the handler is installed (a background job's SIGINT is ignored until then).
  rm -rf "$scratch/signal-ckpt" "$scratch/signal.out"
  "$megaplan" "${signal_run[@]}" --train-iters 1000000 --save "$scratch/signal-ckpt" >"$scratch/signal.out" 2>&1 &
  pid=$!
  for _ in $(seq 300); do grep -q '^iteration ' "$scratch/signal.out" && break; sleep 0.1; done
  grep -q '^iteration ' "$scratch/signal.out" || fail "SIG$signal: no log line reached the file while the run went on"
  kill -"$signal" "$pid"
  wait "$pid"
  code=$?
  [ "$code" -eq 0 ] || fail "SIG$signal under --exit-signal-handler: exit code $code, want 0"
  stopped=$(sed -n 's/^received SIG'"$signal"': stopping at iteration \([0-9]*\).*/\1/p' "$scratch/signal.out")
  [ -n "$stopped" ] || fail "SIG$signal: the run did not say where it stopped: $(tail -2 "$scratch/signal.out")"
  if [ "$signal" = TERM ]; then
    grep -q "^saved .* at iteration $stopped\$" "$scratch/signal.out" || fail "SIGTERM: no save at iteration $stopped"
    expect_ok "${signal_run[@]}" --train-iters $((stopped + 1)) --load "$scratch/signal-ckpt"
    grep -q "^loaded .* at iteration $stopped\$" "$scratch/out" || fail "SIGTERM's checkpoint did not load"
  else
    [ ! -e "$scratch/signal-ckpt/latest_checkpointed_iteration.txt" ] || fail "SIGINT saved a checkpoint"
  fi
done

# Hostile sizes and numbers (issue 18): each is one line and exit 2, at once, before any work.
timed_error() {  # like expect_error, and within 10 s
  local started=$SECONDS
  expect_error "$@"
  [ $((SECONDS - started)) -le 10 ] || fail "megaplan ${*:2}: took $((SECONDS - started)) s"
}
tiny=(--model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --data-path "$scratch/corpus_text_document" --split 1,0,0)
timed_error 'error: --train-iters: product 4611686018427387904 x 4 overflows 64 bits' train --device cpu "${tiny[@]}" --mbs 2 --gbs 4 --train-iters 4611686018427387904
timed_error 'error: --train-iters \(x --global-batch-size: training samples\): must be at most 17179869184' train --device cpu "${tiny[@]}" --train-iters 100000000000
timed_error 'error: --train-iters: out of range: 9223372036854775808 does not fit in 64 bits' train --device cpu "${tiny[@]}" --train-iters 9223372036854775808
timed_error 'error: --eval-iters \(x --global-batch-size x evaluations: validation samples\): must be at most' train --device cpu "${tiny[@]}" --split 1,1,0 --train-iters 2 --eval-iters 100000000000
for flag in --adam-beta1 --adam-eps --lr --weight-decay; do
  timed_error "error: $flag: must be a finite number, got nan" train --device cpu "${tiny[@]}" --train-iters 2 "$flag" nan
done
timed_error 'error: --adam-beta1: must lie in \[0, 1\)' train --device cpu "${tiny[@]}" --train-iters 2 --adam-beta1 1
timed_error 'error: --tp: must be a decimal integer, got "0x10"' describe --model gpt2-124m --cluster h100-x1 --tp 0x10
expect_error 'error: --gpus: world size 8 must be divisible by tp\*pp\*cp = 10\*1\*1 = 10' describe --model gpt2-124m --cluster dgx-h100 --gpus 8 --tp 010
timed_error 'error: --gpus: world size 8 must be divisible by tp\*pp\*cp = 1\*9223372036854775807\*1' simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --pp 9223372036854775807
timed_error 'error: --pipeline-model-parallel-size: must be at most 1024' simulate --model gpt2-124m --cluster dgx-h100 --gpus 2048 --pp 2048 --num-layers 2048
timed_error 'error: --global-batch-size: must be at most 32768 \(samples per iteration, twice the largest published run.s\), got 1000000000' simulate --model gpt2-124m --cluster dgx-h100 --gpus 8 --gbs 1000000000
timed_error 'error: microbatches per iteration .*: must be at most 16384 .*, got 32768' simulate --model gpt2-124m --cluster h100-x1 --gbs 32768 --mbs 1 --trace "$scratch/never.json"
timed_error 'error: --global-batch-size: must be at most 32768' search --model gpt2-124m --cluster dgx-h100 --gpus 8 --gbs 1000000000
timed_error 'error: --num-layers: must be at most 4096' search --model gpt2-124m --cluster dgx-h100 --gpus 8 --num-layers 1000000
timed_error 'error: --threads: must be at most 1024 \(one thread each\), got 40000' search --model gpt2-124m --cluster dgx-h100 --gpus 8 --threads 40000
timed_error 'error: --microbatches: must be at most 16384' schedule --kind gpipe --pp 2 --microbatches 100000000
timed_error 'error: --pp: must be at most 1024' schedule --kind 1f1b --pp 10000 --microbatches 10000
timed_error 'error: --microbatches \(2 x 1024 stages x 16384 microbatches: forward and backward actions\): must be at most 8388608' schedule --kind 1f1b --pp 1024 --microbatches 16384
printf '999999999F0,\n' >"$scratch/huge.csv"
timed_error "error: $scratch/huge.csv: no row runs stage 0, though 999999999F0 \\(row 1\\) names stage 999999999" schedule --import "$scratch/huge.csv" --check
printf '0F99999,\n' >"$scratch/huge.csv"
timed_error "error: $scratch/huge.csv: microbatches \\(the highest microbatch \\+ 1\\): must be at most 16384" schedule --import "$scratch/huge.csv" --check
python3 - "$examples/clusters/a100-40gb-4node.json" "$scratch" <<'PY'
import json, sys
cluster = json.load(open(sys.argv[1]))
nics = json.loads(json.dumps(cluster)); nics["inter_node"]["nics_per_node"] = 100000000
json.dump(nics, open(sys.argv[2] + "/nics.json", "w"))
slow = json.loads(json.dumps(cluster)); slow["inter_node"]["latency_s"] = 1e308
json.dump(slow, open(sys.argv[2] + "/slow.json", "w"))
PY
timed_error 'error: inter_node.nics_per_node: must be at most 64' simulate --model gpt2-124m --cluster "$scratch/nics.json" --gpus 8
timed_error 'error: inter_node.latency_s: must be between 0 and 1 second, got 1e\+308' simulate --model gpt2-124m --cluster "$scratch/slow.json" --gpus 8
python3 -c 'import sys; sys.stdout.write("{\"text\": \"" + "a" * (65 << 20) + "\"}\n")' >"$scratch/long.jsonl"
timed_error "error: --input $scratch/long.jsonl:1 \\(bytes of one line, one document\\): must be at most 67108864" data prepare --input "$scratch/long.jsonl" --output-prefix "$scratch/never"
ls "$scratch" | grep -q '^never_' && fail "a refused data prepare wrote its output"
rm -f "$scratch/long.jsonl"

# Outputs replace only regular files, never an input of the same command.
expect_ok describe --model gpt2-124m --cluster h200-x2 --gbs 8 --out "$scratch/job.json"
cp "$scratch/job.json" "$scratch/job-before.json"
expect_error "error: $scratch/job.json: is an input of this command: an output must not replace it" simulate --plan "$scratch/job.json" --trace "$scratch/job.json"
cmp -s "$scratch/job.json" "$scratch/job-before.json" || fail "simulate --trace replaced its own --plan"
ln -s "$scratch/job-before.json" "$scratch/link.json"
expect_error "error: $scratch/link.json: exists and is not a regular file" describe --model gpt2-124m --cluster h200-x2 --gbs 8 --out "$scratch/link.json"
[ -L "$scratch/link.json" ] || fail "--out replaced a symlink"
mkfifo "$scratch/fifo"
expect_error "error: $scratch/fifo: exists and is not a regular file" simulate --model gpt2-124m --cluster h200-x2 --gbs 8 --trace "$scratch/fifo"
[ -p "$scratch/fifo" ] || fail "--trace replaced a pipe"

# Without a usable GPU, `devices` says so in one line; with one, it lists it.
if "$megaplan" devices >"$scratch/out" 2>"$scratch/err"; then
  [ -s "$scratch/out" ] || fail "devices printed nothing"
else
  expect_error 'error: gpu: ' devices
fi

# Provenance and the errors that suggest a way out (issue 36, items 6 and 7).
# search --json records what it searched; report --search refuses a search of another model or
# cluster, or one that does not say, naming what differs.
expect_ok search --model gpt2-124m --cluster h200-x2 --gbs 8 --top 2 --threads 2 --json
cp "$scratch/out" "$scratch/searched.json"
python3 - "$scratch/searched.json" <<'PY' || fail "search --json lacks its provenance: $(head -c 300 "$scratch/searched.json")"
import json, sys
search = json.load(open(sys.argv[1]))
assert search["model"]["name"] == "gpt2-124m" and search["model"]["spec"]["num_layers"] == 12
assert search["cluster"]["name"] == "h200-x2" and search["cluster"]["gpus"] == 2
assert search["cluster"]["spec"]["gpus_per_node"] == 2
assert search["implementation"]["name"] == "megaplan" and "options" in search["implementation"]
assert search["profile"]["source"] and search["profile"]["gpu"]
PY
expect_ok report --plan "$scratch/small-job.json" --search "$scratch/searched.json" --out "$scratch/provenance.html"
expect_ok search --model gpt2-124m --num-layers 6 --cluster h200-x2 --gbs 8 --top 2 --threads 2 --json
cp "$scratch/out" "$scratch/six-layers.json"
expect_error "error: --search: $scratch/six-layers.json is a search of another model than this plan.s gpt2-124m: num_layers is 6 there, 12 here" \
  report --plan "$scratch/small-job.json" --search "$scratch/six-layers.json" --out "$scratch/never.html"
expect_ok search --model gpt2-124m --cluster dgx-h100 --gpus 2 --gbs 8 --top 2 --threads 2 --json
cp "$scratch/out" "$scratch/h100.json"
expect_error "error: --search: $scratch/h100.json is a search of another cluster \(dgx-h100\) than this plan.s h200-x2: gpu\." \
  report --plan "$scratch/small-job.json" --search "$scratch/h100.json" --out "$scratch/never.html"
expect_ok search --model gpt2-124m --cluster h200-x1 --gbs 8 --top 2 --threads 2 --json
cp "$scratch/out" "$scratch/one-gpu.json"
expect_error "error: --search: $scratch/one-gpu.json is a search of 1 GPU of h200-x1; this plan runs on 2 GPUs of h200-x2" \
  report --plan "$scratch/small-job.json" --search "$scratch/one-gpu.json" --out "$scratch/never.html"
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); [s.pop(k) for k in ("model", "cluster", "implementation")]; json.dump(s, open(sys.argv[2], "w"))' \
  "$scratch/searched.json" "$scratch/older-search.json"
expect_error "error: --search: $scratch/older-search.json records no model and cluster .*: re-run .megaplan search --json." \
  report --plan "$scratch/small-job.json" --search "$scratch/older-search.json" --out "$scratch/never.html"
# A search whose plans the planner could not have ranked there (issue 42).
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); s["plans"][0]["tensor_parallel_size"] = 1024; json.dump(s, open(sys.argv[2], "w")); s["plans"][0]["tensor_parallel_size"] = 1; s["plans"][0]["mfu"] = 7.5; json.dump(s, open(sys.argv[3], "w"))' \
  "$scratch/searched.json" "$scratch/tp1024-search.json" "$scratch/mfu-search.json"
expect_error "error: --search: $scratch/tp1024-search.json: plans\\[0\\]: tp x pp x cp x dp is [0-9]+ GPUs, but the search was of 2" \
  report --plan "$scratch/small-job.json" --search "$scratch/tp1024-search.json" --out "$scratch/never.html"
expect_error "error: --search: $scratch/mfu-search.json: plans\\[0\\]: mfu: must be a finite number >= 0 and at most 1, got 7.5" \
  report --plan "$scratch/small-job.json" --search "$scratch/mfu-search.json" --out "$scratch/never.html"
[ ! -e "$scratch/never.html" ] || fail "a refused report left a file behind"
# Nothing fits: the error also names the smallest GPU count that would, or says none does up to
# core's limit on GPUs.
timed_error 'error: --memory-fraction: no layout fits in .* more; the smallest GPU count where a layout fits is [0-9]+ \(doubling whole nodes of 8 GPUs\)$' \
  search --model gpt3-175b --gpus 8 --gbs 8 --cp 1 --threads 2
timed_error 'error: --memory-fraction: no layout fits in .* more; nor does any on up to 262144 GPUs \(doubling whole nodes of 8 GPUs\)$' \
  search --model gpt2-124m --num-layers 1 --hidden-size 65536 --num-attention-heads 128 --tp 1 --cp 1 --gpus 8 --gbs 8 \
  --threads 2
# A mistyped preset: the nearest one, in the same line.
expect_error 'error: --model: unknown preset "gpt3-17b"; did you mean gpt3-175b\? known presets: gpt2-124m' search --model gpt3-17b
expect_error 'error: --model: unknown preset "Llama3-8B"; did you mean llama3-8b\?' describe --model Llama3-8B --cluster h100-x1
# A Hugging Face export holds the true vocabulary, counts the tensors it writes, and says that the
# checkpoint names no tokenizer.
expect_ok convert --to hf --load "$scratch/llama-ckpt" --save "$scratch/llama-hf-again"
grep -q '^wrote .*llama-hf-again: llama, 21 tensors of tiny-gpt (vocabulary 257) in fp32$' "$scratch/out" ||
  fail "convert --to hf counts its tensors: $(cat "$scratch/out")"
grep -q '^tokenizer: unknown (the checkpoint records none' "$scratch/out" || fail "convert --to hf says nothing of the tokenizer: $(cat "$scratch/out")"
grep -q '"vocab_size": 257$' "$scratch/llama-hf-again/config.json" || fail "convert --to hf pads the vocabulary: $(cat "$scratch/llama-hf-again/config.json")"
! grep -q '_token_id' "$scratch/llama-hf-again/config.json" || fail "convert --to hf names special tokens it does not know"
# A checkpoint saved at tp 2 (the vocabulary padded to 384 rows) loads at tp 1 (320 rows); one of
# another vocabulary is refused.
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --world-size 2 \
  --tp 2 --mbs 1 --gbs 2 --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 --save "$scratch/tp2-ckpt"
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 3 --log-interval 1 --load "$scratch/tp2-ckpt"
grep -q '^iteration 3/3 | loss ' "$scratch/out" || fail "a tp 2 checkpoint does not train on at tp 1: $(cat "$scratch/out")"
# (train prints the run's header before it loads: the refusal is the one line on stderr, exit 2.)
"$megaplan" train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 300 --seq-length 16 --mbs 1 --gbs 2 \
  --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 3 --load "$scratch/tp2-ckpt" >"$scratch/out" 2>"$scratch/err"
code=$?
[ "$code" -eq 2 ] && [ "$(wc -l <"$scratch/err")" -eq 1 ] &&
  grep -qE "error: --load: $scratch/tp2-ckpt/iter_0000002/state.json: the checkpoint.s vocabulary is 257 tokens, the model.s 300 " "$scratch/err" ||
  fail "a checkpoint of another vocabulary: exit $code, stderr $(cat "$scratch/err")"
! grep -q '^iteration ' "$scratch/out" || fail "a checkpoint of another vocabulary was trained on"

# data prepare as Megatron-LM's tools/preprocess_data.py (issue 36): JSON lines known by content, a
# dataset per --json-keys key named PREFIX_<key>_document (its folder made), --workers with the
# output of one, Megatron's --tokenizer-type names; train's --data-path blends. Refusals: one line,
# exit 2, nothing written, and the flags' errors in the command line's order.
printf '{"text": "first", "title": "A"}\n{"text": "second", "title": "BB"}\n' >"$scratch/megatron.json"
expect_ok data prepare --input "$scratch/megatron.json" --json-keys text title --output-prefix "$scratch/made/m" --append-eod
grep -q "^wrote $scratch/made/m_text_document.bin and .idx: 2 documents, 13 tokens " "$scratch/out" &&
  grep -q "^wrote $scratch/made/m_title_document.bin and .idx: 2 documents, 5 tokens " "$scratch/out" ||
  fail "data prepare --json-keys text title: $(cat "$scratch/out")"
python3 -c 'import json, sys
for i in range(6000): print(json.dumps({"text": "line %d: " % i + "caf\u00e9 the world! " * (i % 7)}))' >"$scratch/many.txt"
expect_ok data prepare --input "$scratch/many.txt" --output-prefix "$scratch/workers1" --append-eod --tokenizer gpt2 \
  --vocab-file "$gpt2_tiny/vocab.json" --merge-file "$gpt2_tiny/merges.txt"
grep -q '^wrote .*/workers1_text_document.bin and .idx: 6000 documents, ' "$scratch/out" || fail "JSON lines named .txt: $(cat "$scratch/out")"
expect_ok data prepare --input "$scratch/many.txt" --output-prefix "$scratch/workers2" --append-eod --workers 2 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$gpt2_tiny/vocab.json" --merge-file "$gpt2_tiny/merges.txt"
for suffix in bin idx; do
  cmp -s "$scratch/workers1_text_document.$suffix" "$scratch/workers2_text_document.$suffix" ||
    fail "--workers 2 with --tokenizer-type GPT2BPETokenizer wrote another .$suffix than --workers 1 with --tokenizer gpt2"
done
expect_ok data prepare --input "$scratch/hf.jsonl" --output-prefix "$scratch/hf-megatron" --append-eod \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$hf_tiny/llama3-style"
cmp -s "$scratch/hf_text_document.bin" "$scratch/hf-megatron_text_document.bin" ||
  fail "HuggingFaceTokenizer with its folder as --tokenizer-model tokenizes otherwise than --tokenizer hf"
printf '{\n  "text": "a pretty-printed object"\n}\n' >"$scratch/pretty.json"
expect_error "error: --input: $scratch/pretty.json:1: malformed JSON: a .json or .jsonl file must hold one JSON object per line" data prepare --input "$scratch/pretty.json" --output-prefix "$scratch/never"
expect_error "error: --input: $scratch/megatron.json:1: no string field \"summary\"" data prepare --input "$scratch/megatron.json" --json-keys text summary --output-prefix "$scratch/never"
expect_error "error: --input: $scratch/tiny-gpt.txt: is not JSON lines, so its whole text is key \"text\", which --json-keys does not name" data prepare --input "$scratch/megatron.json" "$scratch/tiny-gpt.txt" --json-keys title --output-prefix "$scratch/never-made/m"
expect_error 'error: --json-keys: "text" is given twice' data prepare --input "$scratch/megatron.json" --json-keys text text --output-prefix "$scratch/never"
expect_error 'error: --tokenizer-type: "BertWordPieceLowerCase" is Megatron-LM.s but not built in megaplan \(supported: GPT2BPETokenizer, HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer\)' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type BertWordPieceLowerCase
expect_error 'error: --tokenizer-type: "TikTokenizer" is Megatron-LM.s but not built' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type TikTokenizer
expect_error 'error: --tokenizer-type: "gpt2" is no Megatron-LM tokenizer type' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type gpt2
expect_error 'error: --tokenizer-type: GPT2BPETokenizer is megaplan.s --tokenizer gpt2, not --tokenizer hf' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type GPT2BPETokenizer --tokenizer hf
expect_error 'error: --vocab-file: --tokenizer-type GPT2BPETokenizer needs its vocab.json' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type GPT2BPETokenizer
expect_error 'error: --tokenizer-model: --tokenizer-type HuggingFaceTokenizer needs its tokenizer.json' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type HuggingFaceTokenizer
expect_error 'error: --workers: must be at least 1, got 0' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --workers 0
expect_error 'error: --workers: must be a decimal integer, got "two"' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --workers two
expect_error 'error: --workers: must be at most 1024' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --workers 1025
expect_error 'error: --tokenizer-type: "NullTokenizer"' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --tokenizer-type NullTokenizer --workers 0
expect_error 'error: --workers: must be at least 1, got 0' data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --workers 0 --tokenizer-type NullTokenizer
expect_ok data prepare --input "$scratch/megatron.json" --output-prefix "$scratch/never" --workers 3 --workers 2 --output-prefix "$scratch/last"
grep -q "^wrote $scratch/last_text_document.bin" "$scratch/out" || fail "a repeated flag's last value is not the one taken: $(cat "$scratch/out")"
ls "$scratch" | grep -q '^never' && fail "a refused data prepare left files or folders behind"
# train: Megatron's --data-path forms and --tokenizer-type.
blend=(train --device cpu --model "$examples/models/tiny-gpt.json" --vocab-size 268 --seq-length 16 --mbs 1 --gbs 2 --split 1,0,0 --log-interval 1)
expect_ok "${blend[@]}" --train-iters 2 --data-path 0.3 "$scratch/corpus_text_document" 0.7 "$scratch/workers1_text_document"
grep -qE "^training data: 2 datasets blended by weight: $scratch/corpus_text_document [0-9]+ samples \(weight 0.3\), $scratch/workers1_text_document [0-9]+ samples \(weight 0.7\)$" "$scratch/out" &&
  grep -q '^iteration 2/2 | loss ' "$scratch/out" || fail "train on a weighted blend: $(cat "$scratch/out")"
expect_ok "${blend[@]}" --train-iters 2 --data-path "$scratch/corpus_text_document" "$scratch/workers1_text_document"
grep -q '^training data: 2 datasets blended by the samples each holds (no weights given): ' "$scratch/out" || fail "train on an unweighted blend: $(cat "$scratch/out")"
expect_error "error: --data-path: \"$scratch/workers1_text_document\" \\(word 3\\) is no weight where other prefixes have one" "${blend[@]}" --train-iters 2 --data-path 0.3 "$scratch/corpus_text_document" "$scratch/workers1_text_document" 0.7
expect_error "error: --data-path: the weight \"0\" of $scratch/corpus_text_document must be a positive finite number" "${blend[@]}" --train-iters 2 --data-path 0 "$scratch/corpus_text_document"
expect_error 'error: --data-path: the 2 datasets given without weights hold [0-9]+ training samples of 17 tokens .*, fewer than the 200000 this run draws' "${blend[@]}" --train-iters 100000 --data-path "$scratch/corpus_text_document" "$scratch/made/m_text_document"
expect_error "error: --data-path: $scratch/nowhere.idx: cannot open" "${blend[@]}" --train-iters 2 --data-path 1 "$scratch/corpus_text_document" 1 "$scratch/nowhere"
expect_error 'error: --tokenizer-type: "BertWordPieceCase" is Megatron-LM.s but not built' "${blend[@]}" --train-iters 2 --data-path "$scratch/corpus_text_document" --tokenizer-type BertWordPieceCase
expect_error 'error: --plan: cannot be combined with --tokenizer-type' train --plan "$scratch/best16.json" --tokenizer-type GPT2BPETokenizer --data-path "$scratch/corpus_text_document" --train-iters 1
expect_ok train --device cpu --model "$examples/models/tiny-gpt.json" --seq-length 16 --mbs 1 --gbs 2 --split 1,0,0 --train-iters 1 \
  --data-path "$scratch/workers2_text_document" --tokenizer-type GPT2BPETokenizer --vocab-file "$gpt2_tiny/vocab.json" --merge-file "$gpt2_tiny/merges.txt"
grep -q '^vocabulary 268 from the tokenizer (gpt2: .*vocab.json)' "$scratch/out" || fail "train --tokenizer-type GPT2BPETokenizer: $(cat "$scratch/out")"

if [ "$failures" -ne 0 ]; then
  echo "$failures end-to-end check(s) failed" >&2
  exit 1
fi
echo "all end-to-end checks passed"
