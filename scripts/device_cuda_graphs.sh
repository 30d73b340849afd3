#!/usr/bin/env bash
# On a GPU machine: the GPU tests of decode CUDA graphs, then benchmarks/cuda_graphs.py (eager vs
# graphs, start time against captured sizes). Usage: scripts/device_cuda_graphs.sh OUTDIR [ROUNDS]
set -uo pipefail
out=$1; rounds=${2:-8}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{ nvidia-smi -L; nproc; python3 -c 'import torch; print("torch", torch.__version__)'; } > "$out/machine.txt" 2>&1
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/integration/reference/test_reference_cuda_graphs_gpu.py \
    > "$out/gpu-tests.txt" 2>&1
echo "gpu tests rc=$?" >> "$out/gpu-tests.txt"
tail -3 "$out/gpu-tests.txt"
timeout 420 python3 benchmarks/cuda_graphs.py --rounds "$rounds" > "$out/eager-vs-graphs.json" 2> "$out/bench.log"
echo "bench rc=$?"; tail -5 "$out/bench.log"
