"""One point of a spec's space from ``key=value`` settings: ``spectune engine-cmd --set``.

A hand-tuned run is reproduced by naming only what differs from the space's first point; the
result may lie outside the space, and SGLang's rules are checked when it becomes an EngineConfig.
"""

from __future__ import annotations

from orchestrator.space.points import ALL_REDUCE_ARMS, Candidate, HasSearchSpace, SpeculativeTriple, canonical_arm
from serving.engine import nccl

__all__ = ["candidate_from_settings"]

_SETTING_ALIASES = {
    "num_steps": "num_steps",
    "speculative_num_steps": "num_steps",
    "steps": "num_steps",
    "eagle_topk": "eagle_topk",
    "speculative_eagle_topk": "eagle_topk",
    "topk": "eagle_topk",
    "num_draft_tokens": "num_draft_tokens",
    "speculative_num_draft_tokens": "num_draft_tokens",
    "draft": "num_draft_tokens",
    "all_reduce": "all_reduce",
}


def candidate_from_settings(spec: HasSearchSpace, settings: dict[str, str]) -> Candidate:
    """One point of the space, from ``key=value`` settings over the space's first point.

    Keys: ``num_steps``, ``eagle_topk``, ``num_draft_tokens`` (or their SGLang names),
    ``all_reduce`` (default / no_fusion / nccl), and NCCL variable names (``default`` unsets one). With
    ``eagle_topk=1`` and no draft count given, the draft count follows the steps (chain).
    The result may lie outside the spec's space (to reproduce a hand-tuned run); SGLang's rules
    are checked when it becomes an EngineConfig.

    Raises:
        ValueError: an unknown key or a value that is not a number where one is needed.
    """
    space = spec.space()
    first = next(iter(space))
    triple = first.speculative
    steps, topk, draft = triple.num_steps, triple.eagle_topk, triple.num_draft_tokens
    all_reduce = first.all_reduce
    env = dict(first.nccl_env)
    given: set[str] = set()
    for raw_key, value in settings.items():
        key = raw_key.strip()
        if key.startswith("NCCL_") or key in space.nccl_env or any(key in p for p in space.nccl_presets or ()):
            if value.strip().lower() in ("default", "unset", ""):
                env.pop(key, None)
            else:
                env[key] = nccl.normalise_value(key, value)  # EngineConfig checks the value itself
            continue
        name = _SETTING_ALIASES.get(key.replace("-", "_"))
        if name is None:
            allowed = sorted({*_SETTING_ALIASES.values(), "NCCL_*"})
            raise ValueError(f"unknown setting {raw_key!r}; allowed: {', '.join(allowed)}")
        if name == "all_reduce":
            value = canonical_arm(value)
            if value not in ALL_REDUCE_ARMS:
                raise ValueError(f"all_reduce={value!r}: use one of {', '.join(ALL_REDUCE_ARMS)}")
            all_reduce = value  # type: ignore[assignment]
            continue
        try:
            number = int(value)
        except ValueError:
            raise ValueError(f"{raw_key}={value!r} is not an integer") from None
        given.add(name)
        if name == "num_steps":
            steps = number
        elif name == "eagle_topk":
            topk = number
        else:
            draft = number
    if topk == 1 and steps is not None and "num_draft_tokens" not in given:
        draft = steps + 1
    return Candidate(SpeculativeTriple(steps, topk, draft), all_reduce, env)
