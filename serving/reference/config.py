"""Model presets of the reference engine: named shapes whose weights are generated from a seed.

``--model-path`` names a preset (no files, no downloads); ``--speculative-draft-model-path``
names its early-exit draft. The presets and the draft are described in docs/reference-engine.md
("Presets").
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from serving.reference.tokenizer import END_OF_TURN_ID

__all__ = ["DTYPE_BYTES", "DTYPE_NAMES", "PRESETS", "ROPE_MARGIN", "ModelPreset", "get_preset", "resolve_draft_layers", "scratch_columns"]

ROPE_MARGIN = 1024
"""Rotary positions past ``max_context_length`` (a draft tree is at most 64 steps deep)."""

DTYPE_BYTES: Mapping[str, int] = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each resolved ``--dtype``: what weights and KV cache take in memory."""

DTYPE_NAMES: Mapping[str, str] = {"float64": "float64", "double": "float64", "float32": "float32",
                                  "float": "float32", "bfloat16": "bfloat16", "float16": "float16",
                                  "half": "float16"}
"""``--dtype`` values and the dtype each names (``model.dtype_from_name`` maps them to torch's)."""


def scratch_columns(*, num_steps: int, eagle_topk: int, num_draft_tokens: int) -> int:
    """KV columns past a request's prefix that one speculative cycle writes (draft or verify)."""
    return max(num_draft_tokens, 1 + (num_steps - 1) * eagle_topk)


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    """One model shape and how its weights are made.

    Attributes:
        name: The ``--model-path`` that selects it.
        hidden_size: Residual stream width.
        num_layers: Transformer blocks.
        num_heads: Attention heads (no GQA); must divide by the TP size.
        intermediate_size: SwiGLU width; must divide by the TP size.
        vocab_size: Byte tokens + special tokens (+ padding).
        context_length: Default ``--context-length``.
        dtype: Default ``--dtype``.
        seed: Default weight seed (``--random-seed`` overrides it).
        draft_layers: Early-exit depth of the default draft.
        deep_residual_scale: Scale of the residual contributions of layers >= draft_layers.
        logit_scale: Multiplies the output layer.
        rope_theta: Rotary embedding base.
        default_max_running_requests: ``--max-running-requests`` without speculation.
        auto_speculative: (steps, topk, draft tokens) chosen when all three are unset.
        architecture: ``architectures[0]`` of the model config, read by SGLang's all-reduce
            fusion rule; ``--json-model-override-args`` overrides it.
        description: One line for the docs and ``/v1/models``.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int = 264
    context_length: int = 2048
    dtype: str = "float64"
    seed: int = 0
    draft_layers: int = 1
    deep_residual_scale: float = 0.5
    logit_scale: float = 4.0
    rope_theta: float = 10000.0
    default_max_running_requests: int = 64
    auto_speculative: tuple[int, int, int] = (3, 1, 4)
    description: str = ""
    architecture: str = "DeepseekV3ForCausalLM"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_context_length(self) -> int:
        """Longest ``--context-length`` accepted: twice the default."""
        return 2 * self.context_length

    @property
    def stop_token_ids_for_chat(self) -> tuple[int, ...]:
        """Extra stop tokens for chat requests: the end-of-turn marker of the template."""
        return (END_OF_TURN_ID,)

    def weight_elements(self, tp_size: int) -> int:
        """Parameters one TP rank holds (replicated ones and its shards)."""
        h, layers = self.hidden_size, self.num_layers
        replicated = 2 * self.vocab_size * h + (2 * layers + 1) * h
        return replicated + layers * (4 * h * h + 3 * h * self.intermediate_size) // tp_size

    def kv_elements_per_token(self, tp_size: int) -> int:
        """KV-cache values one token takes on one TP rank (keys and values of every layer)."""
        return self.num_layers * 2 * (self.hidden_size // tp_size)

    def check_tp(self, tp_size: int) -> None:
        """Raise ``ValueError`` naming the field if this shape cannot be split ``tp_size`` ways."""
        for field in ("num_heads", "intermediate_size"):
            value = getattr(self, field)
            if value % tp_size:
                raise ValueError(
                    f"--tp-size {tp_size} does not divide {self.name}.{field}={value}; "
                    f"use a TP size that divides {value}"
                )


PRESETS: Mapping[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="ref-tiny",
            hidden_size=64,
            num_layers=8,
            num_heads=4,
            intermediate_size=192,
            context_length=2048,
            dtype="float64",
            seed=1234,
            draft_layers=1,
            deep_residual_scale=0.1,
            description="CPU preset: 8 layers x 64 wide, fp64, tiny enough for CI on 2 cores.",
        ),
        ModelPreset(
            name="ref-small",
            hidden_size=512,
            num_layers=12,
            num_heads=8,
            intermediate_size=1536,
            context_length=4096,
            dtype="float64",
            seed=1234,
            draft_layers=2,
            deep_residual_scale=0.1,
            description="Laptop preset: 12 layers x 512 wide, fp64 (about 10x the compute of ref-tiny).",
        ),
        ModelPreset(
            name="ref-gpu-comm",
            hidden_size=2048,
            num_layers=64,
            num_heads=16,
            intermediate_size=5632,
            context_length=4096,
            dtype="float32",
            seed=1234,
            draft_layers=4,
            deep_residual_scale=0.045,
            default_max_running_requests=128,
            description=(
                "GPU preset where TP all-reduce is a real share of a decode step: 64 layers x 2048 "
                "wide (two all-reduces of batch x 2048 values per layer), ~3.3B params, fp32."
            ),
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset named by ``--model-path``; the error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"--model-path {name!r} is not a reference-engine preset; known presets: "
            f"{', '.join(sorted(PRESETS))}"
        ) from None


_DRAFT_RE = re.compile(r"^(?P<base>.+?)-draft(?:-L(?P<layers>\d+))?$")


def resolve_draft_layers(*, draft_path: str, preset: ModelPreset) -> int:
    """Map ``--speculative-draft-model-path`` to the early-exit depth of the draft.

    Raises:
        ValueError: the path names another preset, a depth outside [1, num_layers), or nothing
            recognisable; the message names the flag and the accepted spellings.
    """
    if draft_path == preset.name:
        return preset.draft_layers
    match = _DRAFT_RE.match(draft_path)
    if not match or match.group("base") != preset.name:
        raise ValueError(
            f"--speculative-draft-model-path {draft_path!r} does not belong to --model-path "
            f"{preset.name!r}; use {preset.name}-draft, {preset.name}-draft-L<k> or {preset.name}"
        )
    layers = int(match.group("layers")) if match.group("layers") else preset.draft_layers
    if not 1 <= layers < preset.num_layers:
        raise ValueError(
            f"--speculative-draft-model-path {draft_path!r}: the early exit must be after 1 to "
            f"{preset.num_layers - 1} layers of {preset.name}, got {layers}"
        )
    return layers
