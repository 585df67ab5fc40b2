#!/usr/bin/env bash
# Every benchmark of the README's "Performance" tables, one after the other, on a quiet machine:
#   scripts/benchmarks.sh [OUT_DIR]     (default: bench-results)
# Each writes OUT_DIR/<name>.json (every figure, the settings and the environment) and prints its
# table, which is also kept in OUT_DIR/<name>.txt. First the whole runs (the training command
# against the book's PyTorch training, 3 rounds of each, book settings: about 7 minutes per model
# on 2 cores), then the rest (about 25 minutes).
set -euo pipefail
out=${1:-bench-results}
mkdir -p "$out"
run() {
  local name=$1
  shift
  echo "== jax-attention bench $* --json $out/$name.json" >&2
  jax-attention bench "$@" --no-progress --json "$out/$name.json" | tee "$out/$name.txt"
}
run whole-run-transformer train --whole-run --model transformer --whole-run-cache both
run whole-run-bahdanau train --whole-run --model bahdanau --whole-run-cache both
run attention attention
run memory memory
run train-bahdanau train --model bahdanau
run train-transformer train --model transformer
run decode decode
