#!/usr/bin/env bash
# Install PyTorch into the given Python's environment without ever pulling a CUDA build onto a
# machine that has no GPU. Usage: scripts/install_torch.sh PYTHON [VERSION]
#   TORCH_INDEX_URL  extra index to look in (e.g. PyTorch's CPU wheel index), optional.
# uv is used where the environment has it (seconds instead of a minute); pip's find-links (local
# wheel folders, from PIP_FIND_LINKS or pip's config) are passed on to it, as pip would use them.
set -euo pipefail
python=$1
version=${2:-2.13.0}
if "$python" -c "import torch" 2>/dev/null; then
    exit 0
fi
extra=()
[ -n "${TORCH_INDEX_URL:-}" ] && extra=(--extra-index-url "$TORCH_INDEX_URL")
# 1. The CPU build, from wherever pip is configured to look (local wheels, TORCH_INDEX_URL, ...).
if "$python" -m uv --version >/dev/null 2>&1; then
    links=()
    for link in ${PIP_FIND_LINKS:-$("$python" -m pip config get global.find-links 2>/dev/null || true)}; do
        links+=(--find-links "$link")
    done
    if "$python" -m uv pip install --quiet --compile-bytecode --python "$python" "${links[@]}" "${extra[@]}" "torch==${version}+cpu" 2>/dev/null; then
        exit 0
    fi
fi
if "$python" -m pip install --quiet "${extra[@]}" "torch==${version}+cpu" 2>/dev/null; then
    exit 0
fi
# 2. Machines whose default build is already CPU-only (macOS, aarch64 Linux), or that have a GPU.
if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ] || command -v nvidia-smi >/dev/null; then
    exec "$python" -m pip install --quiet "${extra[@]}" "torch==${version}"
fi
echo "No CPU build of torch ${version} is reachable, and the default x86_64 Linux build is a CUDA build" >&2
echo "of several GB. Set TORCH_INDEX_URL to PyTorch's CPU wheel index and run again." >&2
exit 1
