#!/usr/bin/env bash
# The dependency rule of docs/architecture.md ("Folders and what may include what"), checked on
# every #include: core includes only core; simulator, planner and executor include only core and
# their own folder; reports include those and the simulator's and planner's (what they render);
# cli, tests, bench, examples and tools are free. CMake cannot enforce it
# (every target sees the whole source tree), so this test does. Bash, grep and awk only: CI is a
# bare Debian 12.
#   usage: dependency_rule_test.sh ROOT      one line per violation, exit 1 if any, else exit 0
#          dependency_rule_test.sh --self-check   the checker against fake trees in a temporary folder
set -uo pipefail

# Folders the rule constrains, and what each may include besides itself.
constrained=(core simulator planner executor reports)
declare -A may_include=([core]="" [simulator]="core" [planner]="core" [executor]="core" [reports]="core,simulator,planner")
# Top-level folders whose headers an include can name.
project_folders="core simulator planner executor reports cli tests bench examples tools profiles"

# check ROOT: prints violations, returns 1 if there are any.
check() {
  local root=$1
  local folders=()
  local folder
  for folder in "${constrained[@]}"; do [ -d "$root/$folder" ] && folders+=("$folder"); done
  [ ${#folders[@]} -eq 0 ] && return 0
  local rules=""
  for folder in "${constrained[@]}"; do rules+="$folder=${may_include[$folder]} "; done
  # grep prints FILE:LINE:TEXT for every include line; awk resolves each target to its top-level
  # folder: `"core/x.h"` from the root, `"x.h"` and `"../y/x.h"` from the including file's folder
  # (the compiler looks there first, and a bare name there stays inside the file's own folder).
  # grep's status 1 (no include at all) is no error; its order is the file system's, hence the sort.
  (cd "$root" && grep -rnE \
      --include='*.h' --include='*.hpp' --include='*.cc' --include='*.cu' --include='*.cuh' --include='*.inc' \
      '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' "${folders[@]}"; [ $? -le 1 ]) |
    sort -t: -k1,1 -k2,2n |
    awk -v rules="$rules" -v project="$project_folders" '
      BEGIN {
        n = split(rules, entries, " ")
        for (i = 1; i <= n; ++i) {
          split(entries[i], pair, "=")
          allowed[pair[1]] = pair[2]
        }
        m = split(project, names, " ")
        for (i = 1; i <= m; ++i) is_project[names[i]] = 1
        violations = 0
      }
      # Lexically normalizes a/b/../c to a/c; returns "" for a path that climbs above the root.
      function normalize(path,   parts, count, out, depth, i) {
        count = split(path, parts, "/")
        depth = 0
        for (i = 1; i <= count; ++i) {
          if (parts[i] == "" || parts[i] == ".") continue
          if (parts[i] == "..") { if (depth == 0) return ""; --depth; continue }
          out[++depth] = parts[i]
        }
        path = ""
        for (i = 1; i <= depth; ++i) path = path (i > 1 ? "/" : "") out[i]
        return path
      }
      {
        file = $0; sub(/:.*/, "", file)
        rest = substr($0, length(file) + 2)
        line = rest; sub(/:.*/, "", line)
        text = substr(rest, length(line) + 2)
        quoted = text ~ /include[[:space:]]*"/
        target = text
        sub(/^[^"<]*["<]/, "", target)
        sub(/[">].*$/, "", target)
        first = target; sub(/\/.*/, "", first)
        if ((first in is_project) && index(target, "/") > 0) {
          resolved = normalize(target)
        } else if (quoted) {
          directory = file; sub(/\/[^\/]*$/, "", directory)
          resolved = normalize(directory "/" target)
        } else {
          next  # <vector>, <nlohmann/json.hpp>: not ours
        }
        if (resolved == "") next
        owner = file; sub(/\/.*/, "", owner)
        to = resolved; sub(/\/.*/, "", to)
        if (!(to in is_project) || to == owner) next
        ok = 0
        k = split(allowed[owner], permitted, ",")
        for (i = 1; i <= k; ++i) if (permitted[i] == to) ok = 1
        if (ok) next
        rule = allowed[owner] == "" ? owner : allowed[owner] " and " owner
        gsub(/,/, ", ", rule)
        printf "%s:%s: %s includes %s (%s may include only %s)\n", file, line, file, resolved, owner, rule
        ++violations
      }
      END { exit violations > 0 ? 1 : 0 }'
}

# expect NAME WANT_EXIT WANT_OUTPUT ROOT: runs check on ROOT and compares.
expect() {
  local name=$1 want_exit=$2 want_output=$3 root=$4
  local output exit_code
  output=$(check "$root")
  exit_code=$?
  if [ "$exit_code" -ne "$want_exit" ] || [ "$output" != "$want_output" ]; then
    echo "FAIL: $name: exit $exit_code (want $want_exit), output:" >&2
    printf '%s\n--- want:\n%s\n' "$output" "$want_output" >&2
    return 1
  fi
}

self_check() {
  scratch=$(mktemp -d)  # global: the EXIT trap reads it after this function returns
  trap 'rm -rf "$scratch"' EXIT
  write() { mkdir -p "$(dirname "$1")" && printf '%s\n' "${@:2}" >"$1"; }

  # A clean tree: every allowed edge, comments and system headers, and the free folders.
  local clean=$scratch/clean
  write "$clean/core/a.h" '#pragma once' '#include <vector>' '#include "core/schedule/b.h"'
  write "$clean/core/schedule/b.h" '#pragma once' '#include "../a.h"' '#include "c.h"'
  write "$clean/core/schedule/c.h" '// #include "simulator/engine.h" is only a comment' '#include <nlohmann/json.hpp>'
  write "$clean/simulator/engine.cc" '#include "simulator/engine.h"' '  #  include "core/a.h"'
  write "$clean/planner/search.cc" '#include "core/a.h"' '#include "planner/search.h"'
  write "$clean/executor/kernels/k.cu" '#include "cuda_runtime.h"' '#include "executor/comm/comm.h"' '#include <core/a.h>'
  write "$clean/reports/trace.cc" '#include "core/a.h"' '#include "reports/trace.h"'
  write "$clean/cli/main.cc" '#include "planner/search.h"' '#include "simulator/engine.h"' '#include "executor/k.h"'
  write "$clean/tests/x_test.cc" '#include "simulator/engine.h"' '#include "executor/k.h"'
  write "$clean/core/notes.txt" '#include "simulator/engine.h"'
  expect "clean tree" 0 "" "$clean" || return 1

  # One violation.
  local one=$scratch/one
  write "$one/core/x.h" '#pragma once' '#include "core/y.h"' '#include "simulator/y.h"'
  write "$one/simulator/y.h" '#pragma once' '#include "core/x.h"'
  expect "one violation" 1 "core/x.h:3: core/x.h includes simulator/y.h (core may include only core)" "$one" || return 1

  # Each constrained folder, through root-relative, relative and angle-bracket paths.
  local many=$scratch/many
  write "$many/planner/p.cc" '#include "executor/train/trainer.h"'
  write "$many/simulator/s.cc" '#include "../planner/search.h"'
  write "$many/executor/e.cc" '#include <simulator/engine.h>'
  write "$many/reports/r.cc" '#include "simulator/engine.h"' '#include "cli/commands.h"' '#include "executor/k.h"'
  write "$many/core/schedule/c.cc" '#include "../../reports/trace.h"'
  expect "every folder" 1 "core/schedule/c.cc:1: core/schedule/c.cc includes reports/trace.h (core may include only core)
executor/e.cc:1: executor/e.cc includes simulator/engine.h (executor may include only core and executor)
planner/p.cc:1: planner/p.cc includes executor/train/trainer.h (planner may include only core and planner)
reports/r.cc:2: reports/r.cc includes cli/commands.h (reports may include only core, simulator, planner and reports)
reports/r.cc:3: reports/r.cc includes executor/k.h (reports may include only core, simulator, planner and reports)
simulator/s.cc:1: simulator/s.cc includes planner/search.h (simulator may include only core and simulator)" "$many" ||
    return 1
  echo "dependency rule self-check: passed"
}

if [ $# -ne 1 ]; then
  echo "usage: $0 ROOT | --self-check" >&2
  exit 2
fi
if [ "$1" = "--self-check" ]; then
  self_check
  exit $?
fi
[ -d "$1/core" ] || { echo "$0: $1 has no core/ folder" >&2; exit 2; }
check "$1"
