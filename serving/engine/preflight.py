"""What the sweep's and ``spectune serve``'s preflights share: "can this engine start here?" and
"does the cluster have a node for it?", answered in seconds instead of after minutes of Ray
waiting for a node that does not exist or of engine launches retried.

* ``engine_problems`` runs on the node that will run the engine (in-process for a local cluster,
  or in a Ray task placed like the engine, ``run_where_placed``) and returns plain data: the
  engine's package imports there, local model and draft paths exist there (a hub id ``org/name``
  is accepted with a note), a reference-engine preset is a known one.
* ``alive_nodes`` / ``units_that_fit`` / ``wait_for_fit``: the cluster's nodes and how many
  placement units (one trial, one replica: resources that must share a node) they can hold.

Each caller words its own message (its own field names and options); these only measure.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "HUB_ID",
    "PROGRESS_EVERY_S",
    "alive_nodes",
    "engine_problems",
    "plural",
    "run_where_placed",
    "units_that_fit",
    "wait_for_fit",
]

PROGRESS_EVERY_S = 30.0
"""How often a waiting preflight says what it waits for."""

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""``org/name``: a Hugging Face hub id (SGLang downloads it, or finds it in the HF cache)."""

SWEEP_FIELDS = {"kind": "engine.kind", "model": "engine.model_path", "draft": "engine.draft_model_path"}
"""The field names a sweep spec gives the engine's kind, model and draft (the default)."""


def plural(count: float, word: str) -> str:
    """``8 GPUs``, ``1 CPU``, ``0.5 CPUs``."""
    shown = f"{count:g}"
    return f"{shown} {word}{'' if shown == '1' else 's'}"


def engine_problems(*, kind: str, model_path: str, draft_path: str | None,
                    fields: Mapping[str, str] = SWEEP_FIELDS) -> dict[str, Any]:
    """What would stop the engine from starting on this node (run it there; plain data back).

    Args:
        kind: ``sglang`` or ``reference``.
        model_path: The engine's model (a path, a hub id, or a reference preset).
        draft_path: The draft model, when speculative decoding is on.
        fields: How the caller's file names ``kind``, ``model`` and ``draft`` (for the messages).

    Returns:
        ``{"problems": [...], "notes": [...], "node": hostname}``; each problem names its field,
        value and fix.
    """
    import socket

    problems: list[str] = []
    notes: list[str] = []
    node = socket.gethostname()
    if kind == "sglang":
        if importlib.util.find_spec("sglang") is None:
            problems.append(
                f"{fields['kind']}: sglang: the package 'sglang' cannot be imported on node {node} ({sys.executable}); "
                "install it there: pip install 'sglang[all]' (or pip install 'spectune[sglang]'), or use kind: "
                "reference to try spectune on the CPU reference engine"
            )
        for field, path in ((fields["model"], model_path), (fields["draft"], draft_path)):
            if path is None:
                continue
            local = path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()
            if local and not Path(path).expanduser().exists():
                problems.append(f"{field}: {path} does not exist on node {node}; give an existing local path "
                                "or a Hugging Face hub id (org/name)")
            elif not local and HUB_ID.match(path):
                notes.append(f"{field}: {path!r} is taken as a Hugging Face hub id (SGLang loads it from the HF "
                             "cache or downloads it on the first start, which can take long)")
            elif not local:
                problems.append(f"{field}: {path!r} is neither an existing local path on node {node} nor a hub "
                                "id (org/name)")
    else:
        for module in ("torch", "serving.reference"):
            if importlib.util.find_spec(module) is None:
                problems.append(f"{fields['kind']}: reference: the module {module!r} cannot be imported on node "
                                f"{node} ({sys.executable}); install spectune there (pip install -e .)")
        if not problems:
            from serving.reference.config import get_preset, resolve_draft_layers

            try:
                preset = get_preset(model_path)
            except (KeyError, ValueError) as exc:
                problems.append(f"{fields['model']}: {exc}")
            else:
                if draft_path is not None:
                    try:
                        resolve_draft_layers(draft_path=draft_path, preset=preset)
                    except ValueError as exc:
                        problems.append(f"{fields['draft']}: {exc}")
    return {"problems": problems, "notes": notes, "node": node}


# --- the cluster's nodes -----------------------------------------------------------------------


def alive_nodes() -> list[dict[str, float]]:
    """The total resources of each live node of the connected Ray cluster."""
    import ray

    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


def units_that_fit(nodes: list[dict[str, float]], unit: Mapping[str, float]) -> float:
    """How many copies of ``unit`` (resources that must share one node) the nodes hold together.

    A unit asking for nothing fits without limit (``math.inf``)."""
    wanted = {name: amount for name, amount in unit.items() if amount > 0}
    if not wanted:
        return math.inf
    return sum(min(math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in wanted.items())
               for node in nodes)


def wait_for_fit(fits: Callable[[list[dict[str, float]]], bool], *, wait_s: float, say: Callable[[str], None],
                 describe: Callable[[list[dict[str, float]]], str], poll_s: float = 2.0,
                 nodes: Callable[[], list[dict[str, float]]] = alive_nodes) -> tuple[bool, list[dict[str, float]], float]:
    """Look at the cluster's nodes until ``fits`` them or ``wait_s`` has passed.

    Args:
        fits: Whether these nodes are enough.
        wait_s: How long to keep looking (nodes joining, an autoscaler adding them); 0: look once.
        say: Where the progress lines go, every ``PROGRESS_EVERY_S``: ``describe(nodes)``.
        nodes: The nodes now (``alive_nodes``; a test passes its own).

    Returns:
        Whether they fit, the nodes last seen, and the seconds waited.
    """
    started = last_said = time.monotonic()
    while True:
        seen = nodes()
        waited = time.monotonic() - started
        if fits(seen):
            return True, seen, waited
        if waited >= wait_s:
            return False, seen, waited
        if time.monotonic() - last_said >= PROGRESS_EVERY_S:
            say(f"waiting for resources ({waited:.0f} of {wait_s:g} s): {describe(seen)}")
            last_said = time.monotonic()
        time.sleep(min(poll_s, max(0.0, wait_s - waited)))


def run_where_placed(fn: Callable[..., Any], *, bundles: list[dict[str, float]], bundle_index: int, wait_s: float,
                     say: Callable[[str], None], what: str, strategy: str = "STRICT_PACK", **kwargs: Any) -> Any:
    """``fn(**kwargs)`` in a Ray task in bundle ``bundle_index`` of a ``strategy`` placement group of
    ``bundles``: on the node, with the Python, where the engine will run.

    Args:
        wait_s: How long the group may take to be placed (other work can hold the resources);
            ``say`` hears about it every ``PROGRESS_EVERY_S``.
        what: Whose resources they are, for the messages (``one trial's``).

    Raises:
        TimeoutError: the group was not placed within ``wait_s`` (the message says what to do).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group(bundles, strategy=strategy)
    try:
        started = time.monotonic()
        while True:
            ready, _ = ray.wait([group.ready()], timeout=min(PROGRESS_EVERY_S, max(1.0, wait_s)))
            if ready:
                break
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise TimeoutError(
                    f"resources: no node could give {what} resources ({bundles}) within {waited:.0f} s: other "
                    "work holds them (ray status shows what); wait for it, or pass --wait-for-resources SECONDS"
                )
            say(f"waiting for a node to free {what} resources {bundles} ({waited:.0f} s so far)")
        task = ray.remote(fn).options(
            num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=bundle_index),
        )
        return ray.get(task.remote(**kwargs), timeout=wait_s)
    finally:
        remove_placement_group(group)
