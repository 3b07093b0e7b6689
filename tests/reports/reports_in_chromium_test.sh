#!/usr/bin/env bash
# Issue 16's browser acceptance: the report of a searched gpt3-175b / 1024-GPU plan (with the
# search's alternatives) and of the gpt-1t / 3072-GPU plan load in headless Chromium with no
# console errors, timeline marks in the window, hover text in the DOM and a screenshot that is not
# blank (report_browser_test.sh); the gpt-1t report is at most 25 MB (its load time is printed,
# not asserted: a timed test fails on a loaded machine; docs/results.md records it); and
# the same for a report with a measured timeline (a CPU run of two pipeline ranks, by train --report
# and by report --measured from its trace).
# Without Chromium (Debian's `chromium`; scripts/setup.sh installs it) the test is skipped (77).
#   reports_in_chromium_test.sh MEGAPLAN_BINARY
set -uo pipefail
megaplan=$1
here=$(cd "$(dirname "$0")" && pwd)
command -v "${CHROMIUM:-chromium}" >/dev/null || { echo "chromium is not installed: skipped"; exit 77; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The template on hand-written data of every section's corner cases (a plan that does not fit, a
# tie, markup and "</script>" in the strings), filled as render_html_report fills it.
python3 "$here/render_template.py" "$here/../../reports/report_template.html" "$here/sample_report_data.json" \
  "$scratch/sample.html" || fail "render_template.py"
bash "$here/report_browser_test.sh" "$scratch/sample.html" || fail "the sample report in Chromium"

"$megaplan" search --model gpt3-175b --cluster dgx-h100 --gpus 1024 --gbs 1536 --top 8 --threads 2 --json \
  >"$scratch/search.json" || fail "search --json"
"$megaplan" search --model gpt3-175b --cluster dgx-h100 --gpus 1024 --gbs 1536 --top 1 --threads 2 \
  --out "$scratch/job.json" >/dev/null || fail "search --out"
"$megaplan" report --plan "$scratch/job.json" --search "$scratch/search.json" --out "$scratch/gpt3.html" ||
  fail "report of gpt3-175b"
bash "$here/report_browser_test.sh" "$scratch/gpt3.html" || fail "the gpt3-175b report in Chromium"

"$megaplan" search --model gpt-1t --cluster dgx-a100-80gb --gpus 3072 --gbs 3072 --top 1 --threads 2 \
  --out "$scratch/gpt1t.json" >/dev/null || fail "search gpt-1t"
"$megaplan" report --plan "$scratch/gpt1t.json" --out "$scratch/gpt1t.html" || fail "report of gpt-1t"
bytes=$(stat -c %s "$scratch/gpt1t.html")
[ "$bytes" -le $((25 * 1024 * 1024)) ] || fail "the gpt-1t report is $bytes bytes, over 25 MB"
# Both of the browser test's loads (the DOM, then the screenshot); the issue's target is 10 s for one.
start=$(date +%s%N)
bash "$here/report_browser_test.sh" "$scratch/gpt1t.html" || fail "the gpt-1t report in Chromium"
milliseconds=$(( ($(date +%s%N) - start) / 1000000 ))
echo "gpt-1t / 3072 GPUs: $bytes bytes, the browser test took $milliseconds ms"
# A report with a measured timeline: a tiny GPT trained on the CPU as a pipeline of two ranks
# (threads), its trace against the same plan simulated.
examples="$here/../../examples"
"$megaplan" data prepare --input "$here/../../README.md" --output-prefix "$scratch/corpus" --append-eod >/dev/null ||
  fail "data prepare"
plan=(--model "$examples/models/tiny-gpt.json" --vocab-size 257 --seq-length 16 --pp 2 --num-layers 4 --mbs 1 --gbs 4)
"$megaplan" train "${plan[@]}" --device cpu --world-size 2 --data-path "$scratch/corpus_text_document" --split 1,0,0 --train-iters 2 \
  --eval-iters 0 --trace "$scratch/measured.json" --report "$scratch/trained.html" --cluster h200-x2 >/dev/null ||
  fail "train --trace --report"
bash "$here/report_browser_test.sh" "$scratch/trained.html" || fail "train --report's page in Chromium"
"$megaplan" report "${plan[@]}" --cluster h200-x2 --measured "$scratch/measured.json" --out "$scratch/measured.html" ||
  fail "report --measured"
for page in trained measured; do
  grep -q 'id="measured"' "$scratch/$page.html" || fail "the $page report has no measured section"
done
echo "PASS"
