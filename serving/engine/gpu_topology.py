"""What kind of GPU node this is (``sm90-nvlink``, ``sm120-pcie``), read with ``nvidia-smi``: the
compute capability and whether every GPU pair is NVLink-connected, the two facts
``serving.all_reduce_rules`` needs. ``nvidia-smi`` sees every GPU whatever CUDA_VISIBLE_DEVICES says.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import Optional

__all__ = ["NodeGpus", "gpu_kind_name", "parse_query", "parse_topology", "read_node_gpus"]

QUERY = ["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"]
TOPOLOGY = ["nvidia-smi", "topo", "-m"]


@dataclass(frozen=True)
class NodeGpus:
    """The node's GPUs as ``nvidia-smi`` reports them.

    Attributes:
        names: Each GPU's product name, by index.
        capability: Compute capability of GPU 0 (``"9.0"``).
        full_nvlink: Every pair of GPUs is connected by NVLink (``NV<n>`` in ``nvidia-smi topo -m``).
        detail: One line for the preflight's output.
    """

    names: tuple[str, ...]
    capability: str
    full_nvlink: bool
    detail: str

    @property
    def kind(self) -> str:
        return gpu_kind_name(self.capability, full_nvlink=self.full_nvlink)


def gpu_kind_name(capability: str, *, full_nvlink: bool) -> str:
    """``"9.0"``, NVLink -> ``sm90-nvlink``; ``"12.0"``, PCIe -> ``sm120-pcie``."""
    major, _, minor = capability.strip().partition(".")
    return f"sm{int(major)}{int(minor or 0)}-{'nvlink' if full_nvlink else 'pcie'}"


def parse_query(text: str) -> list[tuple[int, str, str]]:
    """``0, NVIDIA H200, 9.0`` lines -> ``[(0, "NVIDIA H200", "9.0")]``."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append((int(parts[0]), ", ".join(parts[1:-1]), parts[-1]))
    return out


def parse_topology(text: str, *, count: int) -> bool:
    """Whether ``nvidia-smi topo -m``'s matrix shows NVLink (``NV<n>``) between every pair of the
    first ``count`` GPUs; one GPU has no pair and counts as not NVLink-connected."""
    rows: dict[int, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0].startswith("GPU") and cells[0][3:].isdigit():
            rows[int(cells[0][3:])] = cells[1:]
    if count < 2 or any(i not in rows for i in range(count)):
        return False
    return all(rows[i][j].startswith("NV") for i in range(count) for j in range(count) if i != j and j < len(rows[i]))


def read_node_gpus(*, timeout_s: float = 20.0) -> Optional[NodeGpus]:
    """This node's GPUs, or None where ``nvidia-smi`` is missing or sees none."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        query = subprocess.run(QUERY, capture_output=True, text=True, timeout=timeout_s, check=False)
        gpus = parse_query(query.stdout)
        if not gpus:
            return None
        topology = subprocess.run(TOPOLOGY, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    full = parse_topology(topology.stdout, count=len(gpus))
    names = tuple(name for _, name, _ in gpus)
    link = "NVLink between every pair" if full else ("one GPU" if len(gpus) == 1 else "not NVLink between every pair")
    detail = f"{len(gpus)}x {names[0]}, compute capability {gpus[0][2]}, {link} (nvidia-smi topo -m)"
    return NodeGpus(names=names, capability=gpus[0][2], full_nvlink=full, detail=detail)
