#!/usr/bin/env bash
# Every benchmark of the "Performance" tables of docs/performance.md, one after the other, on a
# quiet machine.
usage() {
  cat <<'USAGE'
usage: scripts/benchmarks.sh [OUT_DIR]     (default: bench-results)

Runs the benchmarks of docs/performance.md one after the other, seven runs of the four
'jax-attention bench' commands:
  whole-run-transformer   bench train --whole-run --model transformer --whole-run-cache both
  whole-run-bahdanau      bench train --whole-run --model bahdanau --whole-run-cache both
  attention               bench attention
  memory                  bench memory
  train-bahdanau          bench train --model bahdanau
  train-transformer       bench train --model transformer
  decode                  bench decode
Each writes OUT_DIR/<name>.json (every figure, the settings and the environment) and prints its
table, also kept in OUT_DIR/<name>.txt; the time each took and the total are printed on stderr.
The whole runs (3 rounds of each peer, book settings) take about 5 minutes per model on 2 cores;
the others are not timed in docs/performance.md: see the times printed at the end.

The command is the checkout's .venv/bin/jax-attention (with the PyTorch peers the benchmarks
need: python3 -m venv .venv && .venv/bin/pip install -e '.[test,torch]', or 'make test'), else
jax-attention on PATH; JAX_ATTENTION=/path/to/jax-attention chooses another.
USAGE
}
set -euo pipefail
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  -*) echo "scripts/benchmarks.sh: unknown option $1" \
            "(OUT_DIR cannot start with '-'; see --help)" >&2
      exit 2 ;;
esac
if [ $# -gt 1 ]; then
  echo "scripts/benchmarks.sh: expected at most one argument, OUT_DIR (see --help)" >&2
  exit 2
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "${JAX_ATTENTION:-}" ]; then
  command=$JAX_ATTENTION
elif [ -x "$root/.venv/bin/jax-attention" ]; then
  command=$root/.venv/bin/jax-attention
elif command -v jax-attention >/dev/null 2>&1; then
  command=$(command -v jax-attention)
else
  echo "scripts/benchmarks.sh: no jax-attention command: neither $root/.venv/bin/jax-attention" \
       "nor one on PATH; in $root run python3 -m venv .venv &&" \
       ".venv/bin/pip install -e '.[test,torch]', or set JAX_ATTENTION=/path/to/jax-attention" >&2
  exit 2
fi
out=${1:-bench-results}
mkdir -p "$out"
start=$SECONDS
run() {
  local name=$1 began=$SECONDS
  shift
  echo "== jax-attention bench $* --json $out/$name.json" >&2
  "$command" bench "$@" --no-progress --json "$out/$name.json" | tee "$out/$name.txt"
  echo "== $name took $(( (SECONDS - began) / 60 )) min $(( (SECONDS - began) % 60 )) s" >&2
}
run whole-run-transformer train --whole-run --model transformer --whole-run-cache both
run whole-run-bahdanau train --whole-run --model bahdanau --whole-run-cache both
run attention attention
run memory memory
run train-bahdanau train --model bahdanau
run train-transformer train --model transformer
run decode decode
total=$(( SECONDS - start ))
echo "== all seven benchmarks took $(( total / 60 )) min $(( total % 60 )) s; results in $out" >&2
