"""What one trial runs: a baseline or a point of the space, as plain data for Ray Tune's config.

``candidate_key`` gives one key per configuration (baselines included), so nothing is measured twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.space.points import Candidate, SpeculativeTriple, canonical_arm

__all__ = ["BASELINE_AUTO", "BASELINE_PLAIN", "TrialPlan", "candidate_key"]

BASELINE_PLAIN = "baseline_plain"
BASELINE_AUTO = "baseline_auto"


@dataclass(frozen=True)
class TrialPlan:
    """What one trial runs: a baseline or a point of the space.

    Attributes:
        kind: ``baseline_plain`` (speculation off), ``baseline_auto`` (SGLang's own numbers) or ``search``.
        candidate: The point (for ``baseline_plain`` its speculative part is ignored).
    """

    kind: str
    candidate: Candidate

    @property
    def speculative(self) -> bool:
        return self.kind != BASELINE_PLAIN

    def params(self) -> dict[str, Any]:
        """The configuration in the sweep's names: what MLflow, trials.jsonl and the summary show."""
        triple = self.candidate.speculative
        out: dict[str, Any] = {
            "speculative": "off" if not self.speculative else ("auto" if triple.is_auto else "explicit"),
            "num_steps": triple.num_steps if self.speculative else None,
            "eagle_topk": triple.eagle_topk if self.speculative else None,
            "num_draft_tokens": triple.num_draft_tokens if self.speculative else None,
            "all_reduce": self.candidate.all_reduce,
        }
        return out

    def label(self) -> str:
        """``steps=3 topk=1 draft=4 NCCL_ALGO=Ring``, ``no speculation``, ``SGLang auto``."""
        if not self.speculative:
            head = "no speculation"
        elif self.candidate.speculative.is_auto:
            head = "SGLang auto"
        else:
            head = self.candidate.speculative.label()
        parts = [head]
        if self.candidate.all_reduce != "default":
            parts.append(f"all_reduce={self.candidate.all_reduce}")
        parts += [f"{k}={v}" for k, v in sorted(self.candidate.nccl_env.items())]
        return " ".join(parts)

    def to_config(self) -> dict[str, Any]:
        """Plain data for Ray Tune's config (crosses process boundaries)."""
        triple = self.candidate.speculative
        return {
            "kind": self.kind,
            "num_steps": triple.num_steps,
            "eagle_topk": triple.eagle_topk,
            "num_draft_tokens": triple.num_draft_tokens,
            "all_reduce": self.candidate.all_reduce,
            "nccl_env": dict(self.candidate.nccl_env),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "TrialPlan":
        plan = config["plan"] if "plan" in config else config
        return cls(
            kind=plan["kind"],
            candidate=Candidate(
                SpeculativeTriple(plan["num_steps"], plan["eagle_topk"], plan["num_draft_tokens"]),
                canonical_arm(plan["all_reduce"]),
                dict(plan["nccl_env"]),
            ),
        )


def candidate_key(plan: TrialPlan) -> str:
    """One string per distinct configuration (baselines included), for de-duplication."""
    data = plan.to_config()
    if plan.kind == BASELINE_PLAIN:
        data.update(num_steps=None, eagle_topk=None, num_draft_tokens=None)
    data["speculative"] = plan.speculative
    data.pop("kind")
    return json.dumps(data, sort_keys=True)
