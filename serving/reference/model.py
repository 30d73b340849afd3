"""The reference transformer: Llama-shaped, weights generated from a seed, sharded for TP.

Pre-norm blocks (RMSNorm, rotary attention, SwiGLU MLP), Megatron-style TP with two all-reduces
per layer. Weights are generated per matrix at full size and sliced, so the model is the same
function at every TP size. ``forward`` runs the first ``num_layers`` layers: all for the target,
``draft_layers`` for the draft (early exit); both share the final norm and output layer.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import zlib
from typing import Optional, Sequence

import torch

from serving.reference.config import DTYPE_NAMES, ROPE_MARGIN, ModelPreset
from serving.reference.kv_cache import KVCache
from serving.reference.parallel import Comm

__all__ = ["Attention", "Model", "PrefillSpan", "dtype_from_name"]

logger = logging.getLogger(__name__)

_DTYPES = {name: getattr(torch, resolved) for name, resolved in DTYPE_NAMES.items()}


def dtype_from_name(name: str) -> torch.dtype:
    """``--dtype`` value -> torch dtype; the error lists the accepted names."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"--dtype {name!r} is not supported; use one of {sorted(_DTYPES)}") from None


@dataclasses.dataclass
class PrefillSpan:
    """One request's tokens in a ragged (prefill) forward: causal over ``[0, start + length)``."""

    row: int
    start: int
    length: int
    offset: int  # where its tokens start in the flattened batch


@dataclasses.dataclass
class Attention:
    """How the tokens of one forward attend.

    Exactly one of two shapes:

    * ragged: ``spans`` lists prefill requests (each causal over its own row);
    * uniform: ``batch`` requests in rows ``0..batch-1`` with ``width`` new tokens each; request
      ``b`` sees its committed prefix ``[0, prefix[b])`` plus, of the scratch columns
      ``prefix[b] + j``, those where ``extra[b, i, j]`` is true (causal, tree or draft mask).
      ``bias`` is that mask as an additive ``[B, 1, width, L]`` tensor (0 or -inf).
    """

    spans: Optional[Sequence[PrefillSpan]] = None
    batch: int = 0
    width: int = 0
    key_len: int = 0
    bias: Optional[torch.Tensor] = None

    @classmethod
    def uniform(
        cls, *, prefix: torch.Tensor, extra: torch.Tensor, dtype: torch.dtype, key_len: Optional[int] = None
    ) -> "Attention":
        """Build the mask once per forward (all layers share it).

        ``key_len`` fixes how many key columns attention reads (a captured CUDA graph's, at
        least the longest prefix plus the scratch); by default just enough, read off ``prefix``
        (a device-to-host sync)."""
        batch, width, scratch = extra.shape
        if key_len is None:
            key_len = int(prefix.max()) + scratch
        cols = torch.arange(key_len, device=prefix.device)
        rel = cols[None, :] - prefix[:, None]  # [B, L]
        in_scratch = (rel >= 0) & (rel < scratch)
        gathered = torch.gather(
            extra, 2, rel.clamp(0, scratch - 1)[:, None, :].expand(batch, width, key_len)
        )
        visible = (rel < 0)[:, None, :] | (gathered & in_scratch[:, None, :])
        bias = torch.zeros(visible.shape, dtype=dtype, device=prefix.device)
        bias.masked_fill_(~visible, float("-inf"))
        return cls(batch=batch, width=width, key_len=key_len, bias=bias[:, None])

    @classmethod
    def decode(
        cls, *, prefix: torch.Tensor, visible: int, dtype: torch.dtype, key_len: Optional[int] = None
    ) -> "Attention":
        """One new token per request that sees ``visible`` scratch columns (all before it);
        ``key_len`` as in :meth:`uniform`."""
        batch = prefix.shape[0]
        if key_len is None:
            key_len = int(prefix.max()) + visible
        cols = torch.arange(key_len, device=prefix.device)
        bias = torch.zeros(batch, key_len, dtype=dtype, device=prefix.device)
        bias.masked_fill_(cols[None, :] >= (prefix + visible)[:, None], float("-inf"))
        return cls(batch=batch, width=1, key_len=key_len, bias=bias[:, None, None, :])


def output_bias(vocab_size: int, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A fixed output-layer bias that keeps generated text to printable ASCII and newline (EOS rare)."""
    from serving.reference.tokenizer import EOS_ID

    bias = torch.full((vocab_size,), -30.0, dtype=torch.float64)
    bias[32:127] = 0.0
    bias[10] = 0.0
    bias[EOS_ID] = -6.0
    return bias.to(dtype=dtype, device=device)


def _seed_for(seed: int, key: str) -> int:
    return zlib.crc32(f"{seed}:{key}".encode()) ^ (seed * 2654435761 % 2**31)


class Model:
    """This rank's shard of a preset's transformer.

    Args:
        preset: Shape and weight recipe.
        seed: Weight seed (the preset's unless ``--random-seed`` overrides it).
        comm: The TP group (all-reduce).
        device: Where weights and activations live.
        dtype: Compute dtype.
    """

    def __init__(
        self,
        *,
        preset: ModelPreset,
        seed: int,
        comm: Comm,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        preset.check_tp(comm.world_size)
        self.preset = preset
        self.comm = comm
        self.device = device
        self.dtype = dtype
        self.num_layers = preset.num_layers
        self.heads = preset.num_heads // comm.world_size
        self.head_dim = preset.head_dim
        self.inter = preset.intermediate_size // comm.world_size
        self._reduce = comm.world_size > 1
        hidden = preset.hidden_size
        rank = comm.rank

        def randn(key: str, shape: tuple[int, ...], std: float) -> torch.Tensor:
            gen = torch.Generator(device=device)
            gen.manual_seed(_seed_for(seed, key))
            out = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
            return (out * std).to(dtype)

        def cols(t: torch.Tensor, width: int) -> torch.Tensor:
            return t[:, rank * width : (rank + 1) * width]

        def rows(t: torch.Tensor, width: int) -> torch.Tensor:
            return t[rank * width : (rank + 1) * width, :]

        qkv_width = self.heads * self.head_dim
        self.embed = randn("embed", (preset.vocab_size, hidden), 1.0)
        self.layers = []
        for layer in range(preset.num_layers):
            scale = 1.0 if layer < preset.draft_layers else preset.deep_residual_scale
            w_in = 1.0 / math.sqrt(hidden)
            # 1/sqrt(head_dim) of the attention scores is folded into W_q (RoPE is linear).
            q_fold = 1.0 / math.sqrt(self.head_dim)
            wqkv = torch.cat(
                [
                    cols(randn(f"L{layer}.w{n}", (hidden, hidden), w_in * (q_fold if n == "q" else 1.0)), qkv_width)
                    for n in "qkv"
                ],
                dim=1,
            ).contiguous()
            wo = rows(randn(f"L{layer}.wo", (hidden, hidden), w_in * scale), qkv_width).contiguous()
            gate = cols(randn(f"L{layer}.gate", (hidden, preset.intermediate_size), w_in), self.inter)
            up = cols(randn(f"L{layer}.up", (hidden, preset.intermediate_size), w_in), self.inter)
            w_gate_up = torch.cat([gate, up], dim=1).contiguous()
            down_std = scale / math.sqrt(preset.intermediate_size)
            w_down = rows(
                randn(f"L{layer}.down", (preset.intermediate_size, hidden), down_std), self.inter
            ).contiguous()
            self.layers.append((wqkv, wo, w_gate_up, w_down))
        self.lm_head = randn("lm_head", (hidden, preset.vocab_size), preset.logit_scale / math.sqrt(hidden))
        self.lm_bias = output_bias(preset.vocab_size, dtype=dtype, device=device)
        self.eps = 1e-6

        max_pos = preset.max_context_length + ROPE_MARGIN
        inv_freq = 1.0 / (
            preset.rope_theta
            ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=device) / self.head_dim)
        )
        angles = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
        # RoPE as a complex rotation of (even, odd) pairs: 3 kernels instead of 9.
        self._rope_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = torch.polar(torch.ones_like(angles), angles)
        self._freqs = freqs.to(torch.complex128 if self._rope_dtype == torch.float64 else torch.complex64)
        n_params = sum(t.numel() for layer in self.layers for t in layer) + self.embed.numel() + self.lm_head.numel()
        logger.info(
            "model %s: %d layers, hidden %d, %d/%d heads on this rank, %.1fM params on this rank, %s on %s",
            preset.name,
            preset.num_layers,
            hidden,
            self.heads,
            preset.num_heads,
            n_params / 1e6,
            str(dtype).replace("torch.", ""),
            device,
        )

    def new_cache(self, *, max_rows: int, max_cols: int) -> KVCache:
        """A KV cache shaped for this rank's heads."""
        return KVCache(
            num_layers=self.num_layers,
            num_heads=self.heads,
            head_dim=self.head_dim,
            max_rows=max_rows,
            max_cols=max_cols,
            dtype=self.dtype,
            device=self.device,
        )

    def _norm(self, x: torch.Tensor, width: int) -> torch.Tensor:
        # RMSNorm with unit weights (random weights gain nothing from a learned scale).
        return torch.nn.functional.rms_norm(x, (width,), eps=self.eps)

    def _rope(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` (``[T, 2, heads, head_dim]``, q and k together) by position."""
        shape = x.shape
        pairs = x.to(self._rope_dtype).reshape(*shape[:-1], shape[-1] // 2, 2)
        rotated = torch.view_as_real(torch.view_as_complex(pairs) * freqs)
        return rotated.reshape(shape).to(x.dtype)

    @torch.inference_mode()
    def forward(
        self,
        *,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_rows: torch.Tensor,
        kv_cols: torch.Tensor,
        attention: Attention,
        cache: KVCache,
        num_layers: int,
        logits_at: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Run tokens through the first ``num_layers`` layers; logits (model dtype) at ``logits_at``
        (all if None). Each token's K/V is written to ``cache`` at ``(kv_rows, kv_cols)`` first.
        """
        h = self.embed[input_ids]
        freqs = self._freqs[positions][:, None, None, :]
        n_tok = input_ids.shape[0]
        heads, hd = self.heads, self.head_dim
        hidden = h.shape[-1]
        for layer in range(num_layers):
            wqkv, wo, w_gate_up, w_down = self.layers[layer]
            qkv = (self._norm(h, hidden) @ wqkv).view(n_tok, 3, heads, hd)
            qk = self._rope(qkv[:, :2], freqs)
            q, k = qk[:, 0], qk[:, 1]
            cache.write(layer, kv_rows, kv_cols, k, qkv[:, 2])
            out = self._attend(q, layer, attention, cache) @ wo
            if self._reduce:
                self.comm.all_reduce(out)
            h = h + out
            gate, up = (self._norm(h, hidden) @ w_gate_up).split(self.inter, dim=-1)
            out = (torch.nn.functional.silu(gate) * up) @ w_down
            if self._reduce:
                self.comm.all_reduce(out)
            h = h + out
        if logits_at is not None:
            h = h[logits_at]
        return torch.addmm(self.lm_bias, self._norm(h, h.shape[-1]), self.lm_head)

    def _attend(self, q: torch.Tensor, layer: int, plan: Attention, cache: KVCache) -> torch.Tensor:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        heads, hd = self.heads, self.head_dim
        k_all, v_all = cache.k[layer], cache.v[layer]
        if plan.spans is not None:
            outs = []
            for span in plan.spans:
                end = span.start + span.length
                qs = q[span.offset : span.offset + span.length].transpose(0, 1)[None]  # [1, H, n, D]
                keys = k_all[span.row, :end].transpose(0, 1)[None]  # [1, H, L, D]
                vals = v_all[span.row, :end].transpose(0, 1)[None]
                if span.start == 0:
                    out = sdpa(qs, keys, vals, is_causal=True, scale=1.0)
                else:
                    qpos = torch.arange(span.start, end, device=q.device)[:, None]
                    allowed = torch.arange(end, device=q.device)[None, :] <= qpos
                    out = sdpa(qs, keys, vals, attn_mask=allowed, scale=1.0)
                outs.append(out[0].transpose(0, 1))
            return torch.cat(outs, dim=0).reshape(q.shape[0], heads * hd)
        batch, width, key_len = plan.batch, plan.width, plan.key_len
        qs = q.view(batch, width, heads, hd).transpose(1, 2)  # [B, H, n, D]
        keys = k_all[:batch, :key_len].transpose(1, 2)  # [B, H, L, D]
        vals = v_all[:batch, :key_len].transpose(1, 2)
        out = sdpa(qs, keys, vals, attn_mask=plan.bias, scale=1.0)  # [B, H, n, D]
        return out.transpose(1, 2).reshape(batch * width, heads * hd)
