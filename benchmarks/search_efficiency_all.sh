#!/usr/bin/env bash
# Every grid under benchmarks/data at noise 0, 3%, 5% and its own, through spectune and random search
# (each replayed sweep: budget, then the confirmation); the JSON into benchmarks/data/results/, then
# the tables of docs/search-efficiency.md. Two replays at a time (2 cores). SEEDS=20 by default.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SEEDS=${SEEDS:-20}
OUT=benchmarks/data/results
mkdir -p "$OUT"
jobs=()
for grid in benchmarks/data/*.json; do
  name=$(basename "$grid" .json)
  for noise in 0 0.03 0.05 grid; do
    flag=(); [ "$noise" = grid ] || flag=(--noise-cv "$noise")
    jobs+=("$PY benchmarks/search_efficiency.py --grid $grid --seeds $SEEDS ${flag[*]} --json-out $OUT/search-efficiency-$name-n$noise.json")
  done
done
printf '%s\n' "${jobs[@]}" | xargs -P "${PARALLEL:-2}" -I{} sh -c '{} > /dev/null && echo "done: {}" >&2'
$PY benchmarks/search_efficiency.py --table "$OUT"

# What each part buys (docs/search-efficiency.md, "What each part buys"): the same replays without one part.
[ "${ABLATIONS:-1}" = 1 ] || exit 0
abl=(
  "--grid benchmarks/data/reference-cpu-grid-quiet-simulated-nccl.json --noise-cv 0 --searcher spectune --searcher spectune-unstaged --json-out $OUT/ablation-staged-quiet-simulated-nccl-n0.json"
  "--grid benchmarks/data/reference-cpu-grid-single-simulated-nccl.json --noise-cv 0 --searcher spectune --searcher spectune-unstaged --json-out $OUT/ablation-staged-single-simulated-nccl-n0.json"
  "--grid benchmarks/data/h200-listed-composed.json --noise-cv 0.03 --searcher spectune --searcher spectune-sampled --searcher random --budget 8 --json-out $OUT/ablation-enumeration-h200-listed-composed-n0.03.json"
  "--grid benchmarks/data/h200-listed-composed.json --searcher spectune --searcher random --no-confirmation --json-out $OUT/ablation-no-confirmation-h200-listed-composed-ngrid.json"
  "--grid benchmarks/data/reference-cpu-grid-quiet.json --searcher spectune --searcher random --no-confirmation --json-out $OUT/ablation-no-confirmation-reference-cpu-grid-quiet-ngrid.json"
  "--grid benchmarks/data/h200-listed-composed.json --searcher spectune --top-k 1 --json-out $OUT/ablation-top1-h200-listed-composed-ngrid.json"
)
printf '%s\n' "${abl[@]}" | xargs -P "${PARALLEL:-2}" -I{} sh -c "$PY benchmarks/search_efficiency.py --seeds $SEEDS {} > /dev/null && echo 'done: {}' >&2"
$PY benchmarks/search_efficiency.py --table "$OUT"
