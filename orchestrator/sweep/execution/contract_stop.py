"""Stop the whole sweep when a trial's engine breaks the engine contract (``serving.engine.contract``).

A renamed field is not one trial's bad luck: every later trial would measure with the same blind
spot. The Tune stopper below ends every trial as soon as one trial's final report carries the
``engine_contract`` reason; the driver then raises :class:`EngineContractError` (the CLI's exit 2).
"""

from __future__ import annotations

import json
from typing import Any

from serving.errors import SpectuneError

__all__ = ["ENGINE_CONTRACT", "EngineContractError", "contract_stopper", "engine_contract_error"]

ENGINE_CONTRACT = "engine_contract"
"""The failure reason (``results.FAILURE_REASONS``) that stops the sweep."""


class EngineContractError(SpectuneError):
    """The engine does not answer as the harness expects; the sweep stopped (exit 2)."""


def contract_stopper() -> Any:
    """A Ray Tune stopper whose ``stop_all`` turns true at the first final report of a trial that
    failed ``engine_contract``."""
    from ray.tune import Stopper

    class ContractStop(Stopper):
        def __init__(self) -> None:
            self.broken = False

        def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
            record = result.get("record")
            if result.get("final") and isinstance(record, str):
                self.broken = self.broken or json.loads(record).get("reason") == ENGINE_CONTRACT
            return False

        def stop_all(self) -> bool:
            return self.broken

    return ContractStop()


def engine_contract_error(records: list[Any]) -> EngineContractError | None:
    """The error to stop with, from the first trial record that failed ``engine_contract``; None if none did."""
    broken = next((r for r in records if r.reason == ENGINE_CONTRACT), None)
    if broken is None:
        return None
    return EngineContractError(
        f"trial {broken.number} ({broken.label}): {broken.message}. The sweep stopped after that start: every "
        "trial would miss the same data. spectune reads SGLang 0.5.23's fields (pip install 'spectune[sglang]' pins "
        "it); check the engine's version, or its log in that trial's MLflow run (engine_contract.json names what "
        "it sent)")
