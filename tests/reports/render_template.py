#!/usr/bin/env python3
"""Fill reports/report_template.html the way `megaplan report` does, for tests without the C++.

usage: render_template.py TEMPLATE DATA.json OUT.html [--d3 PATH]

The template holds two lines that are exactly `/*MEGAPLAN_D3*/` and `/*MEGAPLAN_DATA*/` (surrounding
whitespace allowed); each is replaced as a whole line: the first by the d3 bundle, the second by
`window.MEGAPLAN = <json>;`. Inside a <script> element the JSON must not contain `</`, so it is
written as `<\\/` (still the same JSON string); U+2028/2029 are escaped for older parsers.
"""
import json
import sys

D3 = "/usr/share/nodejs/d3/dist/d3.min.js"


def script_safe_json(data):
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.replace("</", "<\\/").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render(template_text, d3_text, data):
    out, seen = [], {"d3": 0, "data": 0}
    for line in template_text.splitlines(keepends=True):
        stripped = line.strip()
        if stripped == "/*MEGAPLAN_D3*/":
            out.append(d3_text.rstrip("\n") + "\n")
            seen["d3"] += 1
        elif stripped == "/*MEGAPLAN_DATA*/":
            out.append("window.MEGAPLAN = " + script_safe_json(data) + ";\n")
            seen["data"] += 1
        else:
            out.append(line)
    if seen != {"d3": 1, "data": 1}:
        raise SystemExit(f"render_template: the template must hold each placeholder line once, found {seen}")
    return "".join(out)


def main(argv):
    args = list(argv[1:])
    d3_path = D3
    if "--d3" in args:
        i = args.index("--d3")
        d3_path = args[i + 1]
        del args[i:i + 2]
    if len(args) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2])
    template_path, data_path, out_path = args
    with open(template_path, encoding="utf-8") as f:
        template = f.read()
    with open(d3_path, encoding="utf-8") as f:
        d3_text = f.read()
    with open(data_path, encoding="utf-8") as f:
        data = json.load(f)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(render(template, d3_text, data))


if __name__ == "__main__":
    main(sys.argv)
