"""Is a Hugging Face hub model whole in this machine's cache? Read from the cache's own layout.

A hub id as ``model_path`` makes SGLang download the model inside the first trial's engine start:
about 600 GB for Kimi-K2.5, within ``engine_start_timeout_s``, and a night's first hour gone. The
preflight runs this on the engine's node and refuses a hub id that is not cached there whole, naming
the download to run first (``hf download ORG/NAME``).

The layout (huggingface_hub's ``file_download``; standard library here, as on a node without
huggingface_hub): ``<cache>/models--ORG--NAME/refs/main`` holds the commit;
``snapshots/<commit>/<file>`` links to ``blobs/<sha256>``; a download in progress leaves
``blobs/<sha>.incomplete`` and no link. The cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["CACHE_VARIABLES", "cached_snapshot", "download_command", "hub_cache_dir", "hub_cache_problem"]

CACHE_VARIABLES = ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")
"""The variables that move the cache (an engine's ``env`` may set them)."""

_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
_WEIGHTS = ("*.safetensors", "*.bin")


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The hub cache that ``env`` (the engine's environment) points huggingface_hub at."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "huggingface" / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def download_command(repo_id: str, env: Mapping[str, str]) -> str:
    """The command that puts ``repo_id`` where an engine with ``env`` will look for it."""
    moved = " ".join(f"{name}={env[name]}" for name in CACHE_VARIABLES if env.get(name))
    return f"{moved + ' ' if moved else ''}hf download {repo_id}"


def _snapshot(repo_dir: Path, revision: str) -> Optional[Path]:
    ref = repo_dir / "refs" / revision
    if ref.is_file():
        snapshot = repo_dir / "snapshots" / ref.read_text(encoding="utf-8").strip()
        return snapshot if snapshot.is_dir() else None
    snapshots = sorted(p for p in (repo_dir / "snapshots").glob("*") if p.is_dir())
    return snapshots[-1] if len(snapshots) == 1 else None


def cached_snapshot(repo_id: str, env: Mapping[str, str], revision: str = "main") -> Optional[Path]:
    """The snapshot folder of ``repo_id`` at ``revision`` in the cache ``env`` points at (what an engine
    with ``env`` loads), or None where there is none."""
    repo_dir = hub_cache_dir(env) / f"models--{repo_id.replace('/', '--')}"
    return _snapshot(repo_dir, revision) if repo_dir.is_dir() else None


def hub_cache_problem(repo_id: str, *, env: Mapping[str, str] | None = None, revision: str = "main") -> Optional[str]:
    """None if ``repo_id`` is cached whole (its config and every weight file its index lists), else
    what is missing, in words (``is not in the Hugging Face cache at ...``)."""
    environ = os.environ if env is None else env
    cache = hub_cache_dir(environ)
    repo_dir = cache / f"models--{repo_id.replace('/', '--')}"
    if not repo_dir.is_dir():
        return f"is not in the Hugging Face cache at {cache}"
    snapshot = _snapshot(repo_dir, revision)
    if snapshot is None:
        return f"has no snapshot of {revision!r} in the Hugging Face cache at {cache} (a download never finished)"
    if not (snapshot / "config.json").is_file():
        return f"has no config.json in its cached snapshot {snapshot}"
    for name in _INDEXES:
        index = snapshot / name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as exc:
                return f"has an unreadable {name} in {snapshot} ({type(exc).__name__})"
            missing = [shard for shard in shards if not (snapshot / shard).is_file()]  # a link to a whole blob
            if missing:
                return (f"is cached only in part: {len(missing)} of {len(shards)} weight files are missing from "
                        f"{snapshot} (first: {missing[0]}; the download did not finish)")
            return None
    if not any(any(snapshot.glob(pattern)) for pattern in _WEIGHTS):
        return f"has no weight files in its cached snapshot {snapshot}"
    return None
