"""Sampling parameters (SGLang's names and checks) and the target distribution they define.

``SamplingParams.from_request`` validates a client's ``sampling_params`` object in the HTTP
process; the same frozen dataclass is pickled to the TP workers, which turn logits into the
distribution to sample from with ``target_probs``. Greedy (temperature 0 or top_k 1) is argmax,
never a sample, so greedy speculative decoding can be exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import torch

__all__ = ["SamplingParams", "target_probs"]

_GREEDY_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """One request's sampling parameters, in SGLang's field names.

    Attributes:
        max_new_tokens: Most tokens to generate (SGLang's default: 128).
        temperature: 0 means greedy.
        top_p: Nucleus mass in (0, 1].
        top_k: -1 (off) or >= 1.
        min_p: In [0, 1].
        stop: Stop strings; generation ends when the text contains one (trimmed from the text).
        stop_token_ids: Extra stop tokens.
        ignore_eos: Keep going past EOS.
        skip_special_tokens: Leave special tokens out of the text.
        no_stop_trim: Keep the matched stop string in the text.
        sampling_seed: Seed of this request's random stream (sampling only). Without it the
            stream is seeded from ``--random-seed`` and the request id.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    sampling_seed: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @classmethod
    def from_request(cls, raw: Optional[Mapping[str, Any]], *, field: str = "sampling_params") -> "SamplingParams":
        """Build and check from a client's JSON object.

        Unknown keys are rejected, as SGLang's ``SamplingParams(**sampling_params)`` does;
        accepted-but-ignored SGLang keys (penalties at their neutral values, ``n == 1``...) pass.

        Raises:
            ValueError: naming the field and the value.
        """
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"{field} must be an object, got {type(raw).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key in _IGNORED_NEUTRAL:
                neutral = _IGNORED_NEUTRAL[key]
                if value is not None and value != neutral:
                    raise ValueError(
                        f"{field}.{key}={value!r} is not supported by the reference engine "
                        f"(only the neutral value {neutral!r})"
                    )
                continue
            if key not in _FIELDS:
                raise ValueError(
                    f"{field}: unexpected keyword argument {key!r}; supported: "
                    f"{', '.join(sorted(_FIELDS))}"
                )
            if value is None:
                continue
            kwargs[key] = _coerce(key, value, field=field)
        params = cls(**kwargs)
        params.verify(field=field)
        return params

    def verify(self, *, field: str = "sampling_params") -> None:
        """SGLang's range checks; raises ``ValueError`` naming the field and value."""
        if self.max_new_tokens < 0:
            raise ValueError(f"{field}.max_new_tokens must be at least 0, got {self.max_new_tokens}")
        if self.temperature < 0.0:
            raise ValueError(f"{field}.temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"{field}.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1 and self.top_k != -1:
            raise ValueError(f"{field}.top_k must be -1 (disable) or at least 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"{field}.min_p must be in [0, 1], got {self.min_p}")
        for s in self.stop:
            if not s:
                raise ValueError(f"{field}.stop must not contain empty strings")


_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# SGLang keys the reference engine accepts only at their "off" value.
_IGNORED_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "spaces_between_special_tokens": True,
    "stream_interval": None,
    "logit_bias": None,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
}


def _coerce(key: str, value: Any, *, field: str) -> Any:
    name = f"{field}.{key}"
    if key in {"max_new_tokens", "top_k", "sampling_seed"}:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ValueError(f"{name} must be an integer, got {value!r}")
        return value
    if key in {"temperature", "top_p", "min_p"}:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} must be a number, got {value!r}")
        return float(value)
    if key in {"ignore_eos", "skip_special_tokens", "no_stop_trim"}:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return value
    if key == "stop":
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(value)
        raise ValueError(f"{name} must be a string or a list of strings, got {value!r}")
    if key == "stop_token_ids":
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return tuple(value)
        raise ValueError(f"{name} must be a list of integers, got {value!r}")
    raise AssertionError(key)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature, then top-k, top-p, min-p.

    Args:
        logits: ``[..., vocab]`` raw logits.
        params: A non-greedy request's parameters.

    Returns:
        Probabilities (float64, normalised) of the same shape.
    """
    probs = torch.softmax(logits.double() / params.temperature, dim=-1)
    vocab = probs.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(probs, params.top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p
        sorted_p = torch.where(before < params.top_p, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    if params.min_p > 0.0:
        floor = probs.max(dim=-1, keepdim=True).values * params.min_p
        probs = torch.where(probs >= floor, probs, torch.zeros_like(probs))
    return probs / probs.sum(dim=-1, keepdim=True)
