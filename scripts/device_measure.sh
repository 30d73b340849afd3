#!/usr/bin/env bash
# Measurements that want a quiet machine with cores to spare (a GPU node), where the serving layer
# and the engine do not compete for two cores as they do on a small CI-like machine:
#   serve   benchmarks/serve_overhead.py on the GPU reference engine (the 1-GPU sweep's best.yaml,
#           both ingress paths) and on the CPU reference engine (HAProxy, the default path)
#   noise   benchmarks/bench_noise.py: the bench's old and new procedure side by side, CPU
#           reference engine, concurrency 1 and 4 (what issue 10 asks)
# Each result is one JSON file in OUTDIR, written when its benchmark ends (a timeout loses only
# that one); stderr beside it. Usage: scripts/device_measure.sh OUTDIR serve|noise
# (after the device-wheels setup; each mode fits one 10-minute device call)
set -uo pipefail
out=$1; what=$2
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
mkdir -p "$out"
{ date -u; nproc; uptime; nvidia-smi -L 2>&1; } > "$out/machine-$what.txt"

measure() {  # measure NAME SECONDS CMD...: stdout (the JSON) to NAME.json, stderr to NAME.log
    local name=$1 limit=$2; shift 2
    echo "== $name (at most ${limit}s): $*"
    local began=$SECONDS
    timeout --kill-after=20 "$limit" "$@" > "$out/$name.json.part" 2> "$out/$name.log"
    local rc=$?
    mv "$out/$name.json.part" "$out/$name.json"
    echo "== $name: rc=$rc in $((SECONDS - began))s"
    tail -n 3 "$out/$name.log"
}

case $what in
serve)
    ray stop --force > /dev/null 2>&1  # a cluster left by an earlier call prints to the next one's stdout
    for ingress in haproxy proxy; do
        measure "serve-overhead-gpu-$ingress" 300 python3 benchmarks/serve_overhead.py \
            --config docs/measurements/gpu-sweep-h200x1/best.yaml --ingress "$ingress" --rounds 6
        ray stop --force > /dev/null 2>&1
    done
    measure serve-overhead-cpu 220 python3 benchmarks/serve_overhead.py --ingress haproxy
    ;;
noise)
    measure bench-noise-cpu 440 python3 benchmarks/bench_noise.py --num-prompts 16 --output-len 128
    ;;
*) echo "usage: $0 OUTDIR serve|noise" >&2; exit 2 ;;
esac
