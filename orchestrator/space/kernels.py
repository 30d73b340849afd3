"""Which chains run the same kernels: where one draft step runs another graph than longer chains.

SGLang 0.5.23 (``sglang/srt/speculative/eagle_worker_v2.py``) builds its draft-decode CUDA graph runner only
for ``speculative_num_steps > 1`` (l.486-508: ``draft_runner_cls = ... if self.speculative_num_steps > 1 else
None``); with one step ``draft_forward`` runs no draft forward at all (l.808-821: the loop breaks at
``i == speculative_num_steps - 1`` before its first forward; l.703-709: "Skip attention backend init for
1-step draft, `draft_forward` only does sample in this case"), so the one-step chain's cycle is the
draft-extend graph and the verify only. The GPU reference engine follows it
(``serving/reference/cuda_graphs.py`` ``draft_graph_name``). Without CUDA graphs (the CPU reference engine,
or decode graphs switched off) every chain runs the same eager kernels, one step included.

Duck-typed on the spec (``gpus_per_trial``, ``engine.extra_args``): nothing here imports the spec.
"""

from __future__ import annotations

from typing import Any

from serving.cuda_graph_rules import decode_backend_of

__all__ = ["one_step_runs_own_graph"]


def one_step_runs_own_graph(spec: Any) -> bool:
    """Whether the one-step chain runs another graph than longer chains: an engine on GPUs whose decode
    runs in CUDA graphs (SGLang's default; off with ``disable_cuda_graph`` / ``disable_decode_cuda_graph``
    or a disabled decode backend in ``engine.extra_args``). Then the chain model (``sweep.search.chain_prediction``)
    starts at two steps, and the opening's shortest chain is the two-step one."""
    if int(getattr(spec, "gpus_per_trial", 0) or 0) <= 0:
        return False
    flags = dict(getattr(getattr(spec, "engine", None), "extra_args", None) or {})
    return decode_backend_of(flags) != "disabled"
