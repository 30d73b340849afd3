"""Sampling parameters (SGLang's names and checks) and the target distribution they define.

The HTTP process validates them (``SamplingParams.from_request``); the TP workers turn logits into
the distribution to sample from (``target_probs``). Greedy (temperature 0 or top_k 1) is argmax.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from serving.reference.checks import SEED_MAX, SEED_MIN, check_finite, check_int, show

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_STREAM_INTERVAL", "MAX_TOKEN_ID", "MAX_TOP_K", "SamplingParams", "output_logprobs", "target_probs"]

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
        stop: Stop strings (trimmed from the text).
        stop_token_ids: Extra stop tokens.
        ignore_eos: Keep going past EOS.
        skip_special_tokens: Leave special tokens out of the text.
        no_stop_trim: Keep the matched stop string in the text.
        sampling_seed: Seed of this request's random stream; None: from ``--random-seed`` and the
            request id.
        stream_interval: Tokens between streamed chunks; None: every iteration.
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
    stream_interval: Optional[int] = None

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    @classmethod
    def from_request(
        cls,
        raw: Optional[Mapping[str, Any]],
        *,
        field: str = "sampling_params",
        names: Optional[Mapping[str, str]] = None,
    ) -> "SamplingParams":
        """Build and check from a client's JSON object: the one validation path of every route.

        Unknown keys are rejected, as SGLang does; SGLang keys this engine ignores pass only at
        their neutral value.

        Args:
            raw: The client's object (None: all defaults).
            field: Prefix of the names in messages (``sampling_params.temperature``).
            names: Per-key names for messages, overriding ``field``.

        Raises:
            ValueError: naming the field, the value and what is allowed.
        """
        name = _namer(field, names)
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ValueError(f"{field} must be an object, got {type(raw).__name__}")
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key in _IGNORED_NEUTRAL:
                neutral = _IGNORED_NEUTRAL[key]
                if value is not None and not _is_neutral(value, neutral):
                    raise ValueError(
                        f"{name(key)}={show(value)} is not supported by the reference engine "
                        f"(only the neutral value {neutral!r})"
                    )
                continue
            if key not in _FIELDS:
                raise ValueError(
                    f"{field}: unexpected keyword argument {show(key)}; supported: "
                    f"{', '.join(sorted(_FIELDS))}"
                )
            if value is None:
                continue
            kwargs[key] = _coerce(key, value, name=name(key))
        params = cls(**kwargs)
        params.verify(field=field, names=names)
        return params

    def verify(self, *, field: str = "sampling_params", names: Optional[Mapping[str, str]] = None) -> None:
        """SGLang's range checks plus what the workers need (finite numbers, seeds torch can take).

        Raises:
            ValueError: naming the field, the value and what is allowed.
        """
        name = _namer(field, names)
        check_int(self.max_new_tokens, name=name("max_new_tokens"), low=0)
        temperature = check_finite(self.temperature, name=name("temperature"))
        if temperature < 0.0:
            raise ValueError(f"{name('temperature')} must be non-negative, got {self.temperature}")
        top_p = check_finite(self.top_p, name=name("top_p"))
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"{name('top_p')} must be in (0, 1], got {self.top_p}")
        if self.top_k != -1:
            try:
                check_int(self.top_k, name=name("top_k"), low=1, high=MAX_TOP_K)
            except ValueError:
                raise ValueError(
                    f"{name('top_k')} must be -1 (disable) or an integer in [1, {MAX_TOP_K}], got {show(self.top_k)}"
                ) from None
        min_p = check_finite(self.min_p, name=name("min_p"))
        if not 0.0 <= min_p <= 1.0:
            raise ValueError(f"{name('min_p')} must be in [0, 1], got {self.min_p}")
        for s in self.stop:
            if not s:
                raise ValueError(f"{name('stop')} must not contain empty strings")
        for index, token in enumerate(self.stop_token_ids):
            check_int(token, name=f"{name('stop_token_ids')}[{index}]", low=0, high=MAX_TOKEN_ID)
        if self.sampling_seed is not None:
            check_int(self.sampling_seed, name=name("sampling_seed"), low=SEED_MIN, high=SEED_MAX)
        if self.stream_interval is not None:
            check_int(self.stream_interval, name=name("stream_interval"), low=1, high=MAX_STREAM_INTERVAL)


MAX_TOP_K = 1 << 30
"""Largest ``top_k`` accepted (SGLang's own stand-in for "off" is ``1 << 30``)."""
MAX_STREAM_INTERVAL = 1 << 30
"""Largest ``stream_interval`` accepted."""
MAX_TOKEN_ID = 2**31 - 1
"""Largest stop token id accepted (int32)."""

_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
# SGLang keys the reference engine accepts only at their "off" value.
_IGNORED_NEUTRAL: dict[str, Any] = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "spaces_between_special_tokens": True,
    "logit_bias": None,
    "regex": None,
    "json_schema": None,
    "ebnf": None,
    "structural_tag": None,
    "custom_params": None,
}


def _namer(field: str, names: Optional[Mapping[str, str]]) -> Callable[[str], str]:
    def name(key: str) -> str:
        if names is not None and key in names:
            return names[key]
        return f"{field}.{key}"

    return name


def _is_neutral(value: Any, neutral: Any) -> bool:
    """Whether ``value`` is the neutral value itself (``true`` is not the number 1)."""
    if isinstance(neutral, bool) or neutral is None:
        return value is neutral
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == neutral


def _coerce(key: str, value: Any, *, name: str) -> Any:
    """Check the JSON type of one field and convert it (ranges are ``verify``'s job)."""
    if key in {"max_new_tokens", "top_k", "sampling_seed", "stream_interval"}:
        if isinstance(value, float) and value.is_integer():  # 16.0 is 16, as pydantic's lax mode
            return int(value)
        return check_int(value, name=name)
    if key in {"temperature", "top_p", "min_p"}:
        return check_finite(value, name=name)
    if key in {"ignore_eos", "skip_special_tokens", "no_stop_trim"}:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {show(value)}")
        return value
    if key == "stop":
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(s, str) for s in value):
            return tuple(value)
        raise ValueError(f"{name} must be a string or a list of strings, got {show(value)}")
    if key == "stop_token_ids":
        if isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return tuple(value)
        raise ValueError(f"{name} must be a list of integers, got {show(value)}")
    raise AssertionError(key)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a sampled request draws from: temperature, then top-k, top-p, min-p.

    Args:
        logits: ``[..., vocab]`` raw logits.
        params: A non-greedy request's parameters.

    Returns:
        Probabilities (float64, normalised) of the same shape.
    """
    import torch  # the TP workers only: the HTTP process never loads torch

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


def output_logprobs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probabilities SGLang reports for output tokens (``return_logprob``), float64 on CPU.

    As SGLang's sampler by default: ``log_softmax`` of the logits, temperature-scaled for sampled
    requests (before top-k/top-p/min-p).

    Args:
        logits: ``[..., vocab]`` raw target logits.
        params: The request's parameters.
    """
    import torch  # the TP workers only: the HTTP process never loads torch

    scaled = logits.double() if params.greedy else logits.double() / params.temperature
    return torch.log_softmax(scaled, dim=-1).cpu()
