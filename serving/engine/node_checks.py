"""What the sweep's and ``spectune serve``'s preflights share: "can this engine start here?" and
"does the cluster have a node for it?", answered in seconds.

``engine_problems`` runs on the engine's node (``run_where_placed`` puts it there);
``alive_nodes`` / ``units_that_fit`` / ``wait_for_fit`` measure the cluster's nodes;
``network_problems`` judges NCCL's node-checked variables on every node that can hold an engine
rank. Each returns data; the caller words its own message.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from serving.engine.hub_cache import CACHE_VARIABLES, download_command, hub_cache_dir, hub_cache_problem

if TYPE_CHECKING:
    from serving.engine.placement import EnginePlacement

__all__ = [
    "HUB_ID",
    "PROGRESS_EVERY_S",
    "alive_nodes",
    "engine_problems",
    "network_problems",
    "plural",
    "run_where_placed",
    "sglang_version_note",
    "units_that_fit",
    "wait_for_fit",
]

PLACEMENT_WAIT_FLOOR_S = 120.0
"""The least time :func:`run_where_placed` waits for its placement group (the resources exist, so
only other work can hold them)."""

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


def sglang_version_note(installed: str | None, *, expected: str, node: str, field: str = "engine.kind") -> str | None:
    """What to say where the SGLang ``installed`` on ``node`` is not the one whose flags and fields
    spectune's rules were read from (``expected``: ``serving.sglang_flags``' version), else None."""
    if installed is None or installed == expected:
        return None
    return (f"{field}: sglang: SGLang {installed} is installed on node {node}; spectune's flag list and rules are "
            f"SGLang {expected}'s, so a flag or field may differ: pip install 'sglang[all]=={expected}' there, or "
            f"regenerate the list for {installed} (python scripts/write_sglang_flags.py --version {installed})")


def engine_problems(*, kind: str, model_path: str, draft_path: str | None,
                    fields: Mapping[str, str] = SWEEP_FIELDS, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What would stop the engine from starting on this node (run it there; plain data back).

    A hub id (``org/name``) for SGLang must be cached whole on this node (``serving.engine.hub_cache``):
    otherwise SGLang downloads it inside the first engine start, and the problem names the download
    to run first.

    Args:
        kind: ``sglang`` or ``reference``.
        model_path: The engine's model (a path, a hub id, or a reference preset).
        draft_path: The draft model, when speculative decoding is on.
        fields: How the caller's file names ``kind``, ``model`` and ``draft`` (for the messages).
        env: The engine's own variables (its ``HF_HOME`` / ``HF_HUB_CACHE`` move the hub cache).

    Returns:
        ``{"problems": [...], "notes": [...], "node": hostname}``; each problem names its field,
        value and fix.
    """
    import socket

    problems: list[str] = []
    notes: list[str] = []
    node = socket.gethostname()
    if kind == "sglang":
        from serving.sglang_flags import sglang_flags

        expected = sglang_flags().version
        if importlib.util.find_spec("sglang") is None:
            problems.append(
                f"{fields['kind']}: sglang: the package 'sglang' cannot be imported on node {node} ({sys.executable}); "
                f"install it there: pip install 'sglang[all]=={expected}' (or pip install 'spectune[sglang]'), or use "
                "kind: reference to try spectune on the CPU reference engine"
            )
        else:
            note = sglang_version_note(_installed_version("sglang"), expected=expected, node=node, field=fields["kind"])
            if note:
                notes.append(note)
        found = model_path_problems(model_path=model_path, draft_path=draft_path, fields=fields, env=env,
                                    where=f"on node {node}")
        problems += found["problems"]
        notes += found["notes"]
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


def _installed_version(package: str) -> str | None:
    """The installed distribution's version (read from its metadata, the package not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None



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
        wait_s: How long the group may take to be placed, at least ``PLACEMENT_WAIT_FLOOR_S``;
            ``say`` hears about it every ``PROGRESS_EVERY_S``.
        what: Whose resources they are, for the messages (``one trial's``).

    Raises:
        TimeoutError: the group was not placed within ``wait_s`` (the message says what to do).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    wait_s = max(wait_s, PLACEMENT_WAIT_FLOOR_S)
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


NETWORK_CHECK_TIMEOUT_S = 60.0
"""How long the network check may take on all nodes together (a task per node, no resources)."""


def network_problems(settings: Iterable[tuple[str, str, str]], *, env: Mapping[str, str],
                     placement: "EnginePlacement", timeout_s: float = NETWORK_CHECK_TIMEOUT_S) -> tuple[str, list[str]]:
    """Judge NCCL's node-checked values on every live node that can hold a rank of ``placement``.

    Args:
        settings: ``(field, variable, value)`` for every node-checked value a trial or replica may
            set: the fixed ``engine.env`` ones and the searched ones, each with its field. Each
            node's own environment is judged too (a pod's ``NCCL_SOCKET_IFNAME``, say).
        env: The engine's fixed environment (``NCCL_IB_HCA`` there selects the ports a
            ``NCCL_IB_GID_INDEX`` is judged on).

    Returns:
        A note of what was checked where, and one line per value that cannot work on a node,
        naming field, value, node and why, with what the node has.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from serving.engine.nccl import NODE_CHECKED_VARIABLES
    from serving.engine.nccl_network import node_problems

    settings = list(settings)
    need = placement.rank_node_need()
    nodes = [n for n in ray.nodes() if n.get("Alive") and units_that_fit([dict(n.get("Resources", {}))], need) >= 1]
    check = ray.remote(node_problems)
    pending = {
        check.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            settings, env=dict(env), inherited=NODE_CHECKED_VARIABLES): n for n in nodes}
    problems: list[str] = []
    for ref, node in pending.items():
        try:
            found = ray.get(ref, timeout=timeout_s)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
            problems.append(f"network: the check of {', '.join(sorted({n for _, n, _ in settings})) or 'NCCL_*'} "
                            f"did not answer from node {node.get('NodeManagerAddress', '?')} (Ray node "
                            f"{node['NodeID'][:8]}) within {timeout_s:g} s ({type(exc).__name__}); is the node "
                            "healthy? (ray status)")
            continue
        where = (f"node {node.get('NodeManagerAddress', '?')} ({found['hostname']}, Ray node {node['NodeID'][:8]}; "
                 f"{found['network']})")
        for field, name, value, why in found["problems"]:
            problems.append(f"{field}: {name}={value!r} cannot work on {where}: it {why}; give a value every node "
                            "has, or remove it")
    names = sorted({name for _, name, _ in settings})
    note = (f"network: {', '.join(names) or 'no value set'} checked on {plural(len(nodes), 'node')} that can run an "
            "engine rank (and what each node's own environment sets)")
    return note, problems


def model_path_problems(*, model_path: str, draft_path: str | None, fields: Mapping[str, str] = SWEEP_FIELDS,
                        env: Mapping[str, str] | None = None, where: str) -> dict[str, list[str]]:
    """SGLang's model and draft paths checked on this machine (``where`` says which, in messages):
    a local path must exist, a hub id (``org/name``) must be cached whole (``serving.engine.hub_cache``:
    otherwise SGLang downloads it inside the first engine start, and the problem names the download
    to run first). Returns ``{"problems": [...], "notes": [...]}``."""
    problems: list[str] = []
    notes: list[str] = []
    for field, path in ((fields["model"], model_path), (fields["draft"], draft_path)):
        if path is None:
            continue
        local = path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()
        if local and not Path(path).expanduser().exists():
            problems.append(f"{field}: {path} does not exist {where}; give an existing local path "
                            "or a Hugging Face hub id (org/name)")
        elif not local and HUB_ID.match(path):
            engine_env = {**os.environ, **{k: v for k, v in (env or {}).items() if k in CACHE_VARIABLES}}
            missing = hub_cache_problem(path, env=engine_env)
            if missing is None:
                notes.append(f"{field}: {path!r} is a Hugging Face hub id, cached whole {where} "
                             f"({hub_cache_dir(engine_env)})")
            else:
                problems.append(
                    f"{field}: {path!r} is a Hugging Face hub id and {missing} {where}: SGLang would "
                    "download it inside the first engine start (hundreds of GB for a large model, within "
                    f"engine_start_timeout_s). Download it first on every node that runs engines: "
                    f"{download_command(path, engine_env)}; or download it to a directory (hf download {path} "
                    f"--local-dir DIR) and set {field} to DIR")
        elif not local:
            problems.append(f"{field}: {path!r} is neither an existing local path {where} nor a hub "
                            "id (org/name)")
    return {"problems": problems, "notes": notes}
