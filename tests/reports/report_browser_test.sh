#!/usr/bin/env bash
# report_browser_test.sh REPORT.html: load a `megaplan report` file in Debian's headless Chromium and
# check that it renders: no console errors or uncaught exceptions, the page's test hooks set
# (body[data-rendered="true"], #timeline[data-visible-slices] > 0, a non-empty #hover-sample; when
# the report has a measured timeline, i.e. #measured is not hidden, #measured[data-visible-slices] > 0
# and a non-empty #measured-hover-sample too), and a screenshot that is not blank. Prints the load times; on failure exits 1 with one line saying why.
#
# Chromium 120+ logs every console message as "INFO:CONSOLE" whatever its level, so console.error
# cannot be told from console.log in stderr. The test therefore loads a copy of the report with a
# small probe script first in <head> that prefixes console.error / window errors / unhandled
# rejections with MEGAPLAN_CONSOLE_ERROR; "Uncaught" lines are caught as well. The copy differs from
# the report only by that probe.
set -euo pipefail

fail() { echo "report_browser_test: FAIL: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || { echo "usage: $0 REPORT.html" >&2; exit 2; }
report=$1
[[ -f $report ]] || fail "no such file: $report"
CHROMIUM=${CHROMIUM:-chromium}
command -v "$CHROMIUM" >/dev/null || fail "$CHROMIUM not found (apt-get install chromium)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
page="$work/report.html"

python3 - "$report" "$page" <<'EOF' || fail "could not prepare the probed copy of $report"
import sys
src, dst = sys.argv[1], sys.argv[2]
text = open(src, encoding="utf-8").read()
probe = """<script>(function () {
  var tag = "MEGAPLAN_CONSOLE_ERROR ";
  var original = console.error.bind(console);
  console.error = function () { original.apply(null, [tag].concat([].slice.call(arguments))); };
  window.addEventListener("error", function (e) { console.log(tag + "uncaught: " + e.message); });
  window.addEventListener("unhandledrejection", function (e) { console.log(tag + "unhandled rejection: " + e.reason); });
})();</script>"""
i = text.find("<head>")
if i < 0:
    sys.exit("no <head> in the report")
i += len("<head>")
open(dst, "w", encoding="utf-8").write(text[:i] + probe + text[i:])
EOF

flags=(--headless=new --no-sandbox --disable-dev-shm-usage --disable-gpu --hide-scrollbars --no-first-run --no-default-browser-check
       --user-data-dir="$work/profile" --virtual-time-budget=10000)
url="file://$page"

now() { date +%s.%N; }
t0=$(now)
"$CHROMIUM" "${flags[@]}" --enable-logging=stderr --v=0 --dump-dom "$url" >"$work/dom.html" 2>"$work/stderr.txt" ||
  fail "chromium --dump-dom exited with $? ($(tail -n 1 "$work/stderr.txt"))"
t1=$(now)
"$CHROMIUM" "${flags[@]}" --window-size=1400,2000 --screenshot="$work/shot.png" "$url" >/dev/null 2>"$work/shot.err" ||
  fail "chromium --screenshot exited with $?"
t2=$(now)

# Console errors: our probe's tag, or Chromium's own "Uncaught ..." on a CONSOLE line.
if grep -E 'CONSOLE' "$work/stderr.txt" | grep -E -m1 'MEGAPLAN_CONSOLE_ERROR|Uncaught' >"$work/err1.txt"; then
  fail "console error: $(cut -c1-300 "$work/err1.txt")"
fi

python3 - "$work/dom.html" "$work/shot.png" <<'EOF' || exit 1
import re, struct, sys, zlib
from html.parser import HTMLParser

def fail(msg):
    print("report_browser_test: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)

class Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.body = {}; self.timeline = {}; self.measured = None; self.samples = {}; self.in_sample = None
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body": self.body = a
        if a.get("id") == "timeline": self.timeline = a
        if a.get("id") == "measured": self.measured = a
        if a.get("id") in ("hover-sample", "measured-hover-sample"): self.in_sample = a["id"]; self.samples[a["id"]] = ""
    def handle_endtag(self, tag):
        if tag == "div": self.in_sample = None
    def handle_data(self, d):
        if self.in_sample: self.samples[self.in_sample] += d

dom = Dom()
dom.feed(open(sys.argv[1], encoding="utf-8", errors="replace").read())
if dom.body.get("data-rendered") != "true":
    fail('body has no data-rendered="true" (the rendering script did not finish)')
def visible_slices(element):
    """The element's data-visible-slices as a number; 0 when missing or not a number."""
    try:
        return int(element.get("data-visible-slices", "0"))
    except ValueError:
        return 0
visible = visible_slices(dom.timeline)
if visible <= 0:
    fail("#timeline data-visible-slices is %r, want > 0" % dom.timeline.get("data-visible-slices"))
dom.sample = dom.samples.get("hover-sample") or ""
if not dom.sample.strip():
    fail("#hover-sample is empty")
# The first visible slice is rank 0's first forward: its hover names its work.
if "FLOP" not in dom.sample:
    fail("#hover-sample names no FLOPs: %r" % dom.sample)
measured_note = ""
if dom.measured is not None and "hidden" not in dom.measured:
    mvisible = visible_slices(dom.measured)
    if mvisible <= 0:
        fail("#measured data-visible-slices is %r, want > 0" % dom.measured.get("data-visible-slices"))
    if not (dom.samples.get("measured-hover-sample") or "").strip():
        fail("#measured-hover-sample is empty")
    measured_note = "; measured: visible slices %d" % mvisible

# Decode the PNG (8-bit RGB/RGBA, non-interlaced, as Chromium writes) and count the pixels that
# differ from the most common colour.
raw = open(sys.argv[2], "rb").read()
if raw[:8] != b"\x89PNG\r\n\x1a\n":
    fail("the screenshot is not a PNG")
pos, idat, width = 8, b"", 0
while pos < len(raw):
    n, ctype = struct.unpack(">I4s", raw[pos:pos + 8])
    chunk = raw[pos + 8:pos + 8 + n]
    if ctype == b"IHDR":
        width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        if depth != 8 or colour not in (2, 6) or interlace:
            fail("unexpected PNG format (depth %d, colour type %d, interlace %d)" % (depth, colour, interlace))
        bpp = 3 if colour == 2 else 4
    elif ctype == b"IDAT":
        idat += chunk
    pos += 12 + n
data = zlib.decompress(idat)
stride = width * bpp
prev = bytearray(stride)
counts = {}
for y in range(height):
    f = data[y * (stride + 1)]
    line = bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    if f == 1:
        for i in range(bpp, stride): line[i] = (line[i] + line[i - bpp]) & 255
    elif f == 2:
        for i in range(stride): line[i] = (line[i] + prev[i]) & 255
    elif f == 3:
        for i in range(stride): line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
    elif f == 4:
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0; b = prev[i]; c = prev[i - bpp] if i >= bpp else 0
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 2 == 0:  # every other row is enough to judge blankness, and halves the work
        for x in range(0, stride, bpp * 2):
            px = bytes(line[x:x + 3])
            counts[px] = counts.get(px, 0) + 1
    prev = line
total = sum(counts.values())
common = max(counts.values())
varied = 1 - common / total
if varied <= 0.01:
    fail("the screenshot is blank: %.2f%% of pixels differ from the most common colour" % (100 * varied))
print("dom: visible slices %d, hover sample %r%s; screenshot %dx%d, %.1f%% non-background pixels"
      % (visible, dom.sample.strip()[:120], measured_note, width, height, 100 * varied))
print("page's own measure (performance.now): rendering script %s ms; navigation start to rendered %s ms"
      % (dom.body.get("data-render-ms", "?"), dom.body.get("data-load-ms", "?")))
EOF

printf 'load time: --dump-dom %.2f s, --screenshot %.2f s (wall clock, including browser start)\n' \
  "$(awk "BEGIN { print $t1 - $t0 }")" "$(awk "BEGIN { print $t2 - $t1 }")"
echo "report_browser_test: PASS: $report"
