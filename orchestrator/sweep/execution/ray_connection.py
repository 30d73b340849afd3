"""The driver's hold on the Ray cluster: connecting, and the sweep's coordinator actor.

The coordinator is named after the results directory in spectune's namespace, so Ray refuses a
second sweep into the same directory and a resumed sweep (a new Ray job) finds it by name.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpectuneError
from orchestrator.sweep.execution.coordinator import NAMESPACE, CoordinatorRef, SweepCoordinator
from serving.ray_auth import choose_local_auth_mode
from serving.waiting import wait_until

__all__ = ["SweepBusyError", "connect_ray", "create_coordinator", "starts_local_cluster"]


class SweepBusyError(SpectuneError):
    """Another sweep is writing the same results directory."""


def connect_ray(address: str | None) -> None:
    """Ray for the driver, once: worker output stays out of the job log (spectune's lines only)."""
    import ray

    if ray.is_initialized():
        return
    if starts_local_cluster(address):
        choose_local_auth_mode()  # Ray's token auth, chosen rather than defaulted: no warning (serving.ray_auth)
    ray.init(address=address, log_to_driver=False, configure_logging=False)


def starts_local_cluster(address: str | None) -> bool:
    """Whether ``ray.init(address=address)`` will start a cluster rather than join one.

    For None, Ray's own answer (private ``canonicalize_bootstrap_address``: ``RAY_ADDRESS``, else a
    local ``ray start`` cluster); False where that helper is missing.
    """
    if address is not None:
        return address == "local"
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return False
    return canonicalize_bootstrap_address(None) is None


def create_coordinator(ref: CoordinatorRef, *, node: str, **kwargs: Any) -> Any:
    """The coordinator actor under its results directory's name, on the driver's node.

    Waits up to a minute for the name: Ray cleans up a killed driver's coordinator within seconds.

    Raises:
        SweepBusyError: another sweep is writing this results directory.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    made: list[Any] = []

    def create() -> bool:
        try:
            made.append(ray.remote(SweepCoordinator).options(
                name=ref.name, namespace=NAMESPACE, num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            ).remote(**kwargs))
        except ValueError:  # the name is taken
            return False
        return True

    try:
        wait_until(create, timeout_s=60, what="the results directory's coordinator name to be free", poll_s=2.0)
    except TimeoutError:
        raise SweepBusyError(
            f"another sweep is writing {kwargs['results_dir']} (its coordinator {ref.name} is alive); wait for it, "
            "stop it (ray job stop), or use another --results-dir"
        ) from None
    return made[-1]
