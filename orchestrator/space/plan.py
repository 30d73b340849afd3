"""What one trial runs: a baseline or a point of the space, as plain data for Ray Tune's config.

A configuration has one identity, :func:`configuration_key`: ``candidate_key`` (what a plan asks
for; nothing is measured twice) and ``TrialRecord.ran_as`` (what a trial ran) are both made by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from orchestrator.space.points import Candidate, SpeculativeTriple, canonical_arm

__all__ = ["BASELINE_AUTO", "BASELINE_PLAIN", "IDENTITY_PARAMS", "TrialPlan", "candidate_key", "configuration_key"]

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


IDENTITY_PARAMS = ("speculative", "num_steps", "eagle_topk", "num_draft_tokens", "all_reduce")
"""The parameters (``TrialPlan.params``) that, with the NCCL variables, make a configuration."""


def configuration_key(params: Mapping[str, Any], nccl_env: Mapping[str, str]) -> str:
    """The one identity of a configuration: its :data:`IDENTITY_PARAMS` (speculation off, auto or
    explicit, the three numbers, the all-reduce arm, or the kernel it ran) and the NCCL variables
    it sets (unset ones left out). Equal keys are one configuration."""
    return json.dumps({**{name: params.get(name) for name in IDENTITY_PARAMS},
                       "nccl_env": dict(sorted(nccl_env.items()))}, sort_keys=True, default=str)


def candidate_key(plan: TrialPlan) -> str:
    """The configuration ``plan`` asks for (baselines included), for de-duplication."""
    return configuration_key(plan.params(), plan.candidate.nccl_env)
