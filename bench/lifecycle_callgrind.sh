#!/bin/bash
# Instructions per command of bench/fold_throughput.py, before and after a change, in one run (pure Python):
#   BEFORE=/path/to/worktree-before AFTER=/path/to/worktree-after PY=.venv/bin/python bash bench/lifecycle_callgrind.sh
# Each tree runs under callgrind with N and 2N measured commands; per command = (I(2N) - I(N)) / N, which leaves out
# start-up and the cluster's build. Issue #25 compared the fold branch (571cdca) with lifecycle (f6c25a0).
set -euo pipefail
PY=${PY:-$PWD/.venv/bin/python}
for spec in "first-fit codec" "fgd-plus fold"; do
  set -- $spec
  for tree in "$BEFORE" "$AFTER"; do
    for n in 2000 4000; do
      out=$(mktemp)
      (cd "$tree" && GPUFOLD_COMPILE=0 valgrind --tool=callgrind --callgrind-out-file="$out" "$PY" bench/fold_throughput.py \
        --nodes 1000 --commands $n --policies "$1" --modes "$2" >/dev/null 2>&1)
      echo "$1 $2 $tree $n $(grep -m1 '^summary:' "$out" | cut -d' ' -f2)"
      rm -f "$out"
    done
  done
done
