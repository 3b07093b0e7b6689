#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz/ (Clang; ASan and UBSan) and fuzzes each on a fresh
# copy of its seed corpus, one after another, then prints a table: target, executions, seconds,
# findings. Exits 1 when any target finds something.
#   usage: scripts/fuzz.sh [--seconds N | --runs N] [--timeout S] [TARGET...]
#     --seconds N  fuzz each target for N seconds (libFuzzer's -max_total_time; default 60)
#     --runs N     fuzz each target for N inputs instead (-runs)
#     --timeout S  an input that runs longer than S seconds is a finding (default 10)
#     TARGET       a name of tests/fuzz/CMakeLists.txt (model_json, schedule_csv, ...); default all
#   MEGAPLAN_FUZZ_BUILD_DIR  build folder (default: build-fuzz)
#   MEGAPLAN_JOBS            parallel build jobs (default: 2)
# A finding (a crash, a sanitizer report, a leak, a timeout, more than 4 GiB of memory, an exception
# other than megaplan::SpecError) is saved as BUILD/findings/TARGET/KIND-SHA1; reproduce it with
# BUILD/tests/fuzz/fuzz_TARGET FILE. Each run's output is in BUILD/fuzz-logs/TARGET.log.
# CI: scripts/fuzz.sh --seconds 5
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${MEGAPLAN_FUZZ_BUILD_DIR:-build-fuzz}
case "$build_dir" in /*) ;; *) build_dir="$root/$build_dir" ;; esac

limit=(-max_total_time=60)
timeout=10
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=(-max_total_time="${2:?--seconds needs a number}"); shift 2 ;;
    --runs) limit=(-runs="${2:?--runs needs a number}"); shift 2 ;;
    --timeout) timeout=${2:?--timeout needs a number}; shift 2 ;;
    -h|--help) sed -n '/^set -euo/q; 2,$p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done

CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -DMEGAPLAN_FUZZ=ON -DMEGAPLAN_BENCHMARKS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON >&2
fuzz_dir="$build_dir/tests/fuzz"
mapfile -t known < "$fuzz_dir/targets.txt"
if [ ${#targets[@]} -eq 0 ]; then
  targets=("${known[@]}")
  build_targets=(all)
else
  build_targets=(fuzz_seed_corpora)
  for target in "${targets[@]}"; do
    if ! printf '%s\n' "${known[@]}" | grep -qx -- "$target"; then
      echo "fuzz.sh: no target $target; known: ${known[*]}" >&2
      exit 2
    fi
    build_targets+=("fuzz_$target")
  done
fi
cmake --build "$build_dir" -j "${MEGAPLAN_JOBS:-2}" --target "${build_targets[@]}" >&2

# UBSan's reports with their stacks (the build already makes them fatal).
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
corpus=$(mktemp -d "${TMPDIR:-/tmp}/megaplan-fuzz-corpus.XXXXXX")
trap 'rm -rf "$corpus"' EXIT
mkdir -p "$build_dir/fuzz-logs"
rows=()
failed=0
for target in "${targets[@]}"; do
  findings="$build_dir/findings/$target"
  log="$build_dir/fuzz-logs/$target.log"
  mkdir -p "$findings"
  rm -rf "${corpus:?}/$target"
  cp -r "$fuzz_dir/seeds/$target" "$corpus/$target"
  options=("${limit[@]}" -rss_limit_mb=4096 -timeout="$timeout" -print_final_stats=1 -artifact_prefix="$findings/")
  dictionary="$fuzz_dir/dictionaries/$target.dict"
  [ -f "$dictionary" ] && options+=(-dict="$dictionary")
  echo "fuzz.sh: fuzzing $target (log: $log)" >&2
  start=$(date +%s.%N)
  status=0
  "$fuzz_dir/fuzz_$target" "${options[@]}" "$corpus/$target" > "$log" 2>&1 || status=$?
  seconds=$(awk -v start="$start" -v end="$(date +%s.%N)" 'BEGIN { printf "%.1f", end - start }')
  # Executions: libFuzzer's final count, else (a run cut short) its last progress line's "#N".
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  [ -n "$executions" ] || executions=$(sed -n 's/^#\([0-9][0-9]*\).*/\1/p' "$log" | tail -1)
  # What libFuzzer saved, but for slow-unit- files: slow inputs below --timeout are no finding.
  found=$(sed -n 's/.*Test unit written to //p' "$log" | grep -v '/slow-unit-' | tr '\n' ' ' | sed 's/ $//' || true)
  if [ -z "$found" ] && [ "$status" -ne 0 ]; then found="exit status $status (see the log)"; fi
  [ -n "$found" ] && failed=1
  rows+=("$(printf '%-20s %12s %9s  %s' "$target" "${executions:-0}" "$seconds" "${found:-0}")")
done

printf '%-20s %12s %9s  %s\n' target executions seconds findings
printf '%s\n' "${rows[@]}"
exit "$failed"
