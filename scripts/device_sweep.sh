#!/usr/bin/env bash
# Run a sweep on a GPU node the way a user does: a Ray head with the node's GPUs (dashboard on:
# `ray job submit` needs it), `ray job submit` from the project directory, then copy what came
# out into OUTDIR (the MLflow DB with its artifacts as a tarball, trials.jsonl, best.yaml, the
# summary and the job log). Usage: scripts/device_sweep.sh SPEC OUTDIR [NUM_GPUS]
# SPECTUNE_DEVICE_TAR=0 leaves the MLflow tarball out (a device call brings back at most 8 files).
# SPECTUNE_DEVICE_LIMIT_S bounds the job (default 540 s), so what it wrote is still copied out
# within one 10-minute device call.
set -uo pipefail
spec=$1; out=$2; gpus=${3:-1}
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
results=/tmp/spectune-results/$(basename "$spec" .yaml)
mkdir -p "$out"
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "cuda devices", torch.cuda.device_count())'; } \
    > "$out/machine.txt" 2>&1
ray start --head --num-gpus="$gpus" --include-dashboard=true --dashboard-host=127.0.0.1 --disable-usage-stats \
    > /tmp/ray-start.log 2>&1 || { cat /tmp/ray-start.log; exit 1; }
timeout "${SPECTUNE_DEVICE_LIMIT_S:-540}" ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
    python3 -m orchestrator.sweep "$spec" --results-dir "$results" 2>&1 | tee "$out/job.log"
rc=${PIPESTATUS[0]}
for f in trials.jsonl best.yaml summary.txt summary.json confirmation.jsonl; do cp "$results/$f" "$out/" 2>/dev/null; done
if [ "${SPECTUNE_DEVICE_TAR:-1}" != 0 ]; then
    tar -czf "$out/results.tar.gz" -C "$(dirname "$results")" "$(basename "$results")" 2>/dev/null
fi
ray stop --force > /dev/null 2>&1
exit "$rc"
