#!/usr/bin/env bash
# Every benchmark of the README's "Performance" table, one after the other, on a quiet machine:
#   scripts/benchmarks.sh [OUT_DIR]     (default: bench-results)
# Each writes OUT_DIR/<name>.json (every figure, the settings and the environment) and prints its
# table, which is also kept in OUT_DIR/<name>.txt. Takes about 25 minutes on 2 cores.
set -euo pipefail
out=${1:-bench-results}
mkdir -p "$out"
run() {
  local name=$1
  shift
  echo "== jax-attention bench $* --json $out/$name.json" >&2
  jax-attention bench "$@" --no-progress --json "$out/$name.json" | tee "$out/$name.txt"
}
run attention attention
run memory memory
run train-bahdanau train --model bahdanau
run train-transformer train --model transformer
run decode decode
