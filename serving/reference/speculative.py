"""EAGLE-style speculative decoding: draft a token tree with the early exit, verify it in one pass.

The tree follows SGLang's EAGLE tree (S steps, top-K per step, N verified nodes); see
docs/reference-engine.md ("Decoding"). Drafted tokens write scratch KV past the committed prefix;
verification overwrites it for all layers.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from serving.reference.config import scratch_columns
from serving.reference.kv_cache import KVCache
from serving.reference.model import Attention, Model
from serving.reference.sampling import SamplingParams, target_probs

__all__ = ["SpecConfig", "VerifyTree", "draft_tree", "verify_tree", "walk_greedy", "walk_sampled"]

# Tie-break towards the shallower candidate, so a child is never chosen without its parent.
_DEPTH_EPS = 1e-9


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Resolved speculative settings.

    Attributes:
        num_steps: Draft forward passes per cycle (S).
        topk: Branching per step (K).
        num_draft_tokens: Nodes verified per cycle, root included (N).
        draft_layers: Early-exit depth of the draft.
    """

    num_steps: int
    topk: int
    num_draft_tokens: int
    draft_layers: int

    @property
    def scratch_cols(self) -> int:
        """Columns past the prefix that one cycle writes (draft inputs or verify nodes)."""
        return scratch_columns(num_steps=self.num_steps, eagle_topk=self.topk, num_draft_tokens=self.num_draft_tokens)


@dataclasses.dataclass
class VerifyTree:
    """The nodes one cycle verifies, per request (node 0 is the root).

    Attributes:
        tokens: ``[B, N]`` token of each node.
        parents: ``[B, N]`` parent node (-1 for the root); parents precede children.
        depth: ``[B, N]`` distance from the root.
        ancestors: ``[B, N, N]`` node i sees node j (ancestors and itself).
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    ancestors: torch.Tensor


def draft_tree(
    *,
    model: Model,
    cache: KVCache,
    roots: torch.Tensor,
    prefix: torch.Tensor,
    config: SpecConfig,
    key_len: Optional[int] = None,
) -> VerifyTree:
    """Draft one tree per running request (rows ``0..B-1`` of ``cache``).

    Args:
        model: The target; the draft is its first ``config.draft_layers`` layers.
        cache: KV cache; the scratch columns past each prefix are overwritten.
        roots: ``[B]`` last committed token of each request (not in the cache yet).
        prefix: ``[B]`` committed KV length of each request (the root's position).
        config: Tree shape.
        key_len: Key columns every attention reads (fixed inside a CUDA graph); None: just enough.
    """
    draft = _draft_chain if config.topk == 1 else _draft_general
    return draft(model=model, cache=cache, roots=roots, prefix=prefix, config=config, key_len=key_len)


def _draft_general(
    *, model: Model, cache: KVCache, roots: torch.Tensor, prefix: torch.Tensor, config: SpecConfig,
    key_len: Optional[int] = None,
) -> VerifyTree:
    """Any topk: SGLang's EAGLE tree."""
    device = roots.device
    batch = roots.shape[0]
    k, steps, n = config.topk, config.num_steps, config.num_draft_tokens
    rows = torch.arange(batch, device=device)
    scratch = 1 + (steps - 1) * k

    logits = model.forward(
        input_ids=roots,
        positions=prefix,
        kv_rows=rows,
        kv_cols=prefix,
        attention=Attention.decode(prefix=prefix, visible=1, dtype=model.dtype, key_len=key_len),
        cache=cache,
        num_layers=config.draft_layers,
    )
    scores, tokens = torch.topk(torch.log_softmax(logits.double(), dim=-1), k, dim=-1)  # [B, K]
    cand_tok = [tokens]
    cand_score = [scores]
    cand_parent = [torch.full((batch, k), -1, dtype=torch.long, device=device)]
    cand_depth = [torch.ones(batch, k, dtype=torch.long, device=device)]
    n_cand = k
    leaf_idx = torch.arange(k, device=device).expand(batch, k)
    leaf_tok, leaf_score = tokens, scores
    leaf_anc = torch.zeros(batch, k, scratch, dtype=torch.bool, device=device)
    leaf_anc[:, :, 0] = True
    ar_k = torch.arange(k, device=device)
    # Device-side: a CUDA graph capture refuses the CPU-to-GPU copy a Python scalar would need.
    true = torch.ones((), dtype=torch.bool, device=device)
    if steps > 1:
        leaf_anc[:, ar_k, 1 + ar_k] = true

    for step in range(2, steps + 1):
        slots = 1 + (step - 2) * k + torch.arange(k, device=device)
        width = 1 + (step - 1) * k
        logits = model.forward(
            input_ids=leaf_tok.reshape(-1),
            positions=(prefix + (step - 1)).repeat_interleave(k),
            kv_rows=rows.repeat_interleave(k),
            kv_cols=(prefix[:, None] + slots[None, :]).reshape(-1),
            attention=Attention.uniform(prefix=prefix, extra=leaf_anc[:, :, :width], dtype=model.dtype, key_len=key_len),
            cache=cache,
            num_layers=config.draft_layers,
        )
        logp = torch.log_softmax(logits.double(), dim=-1).view(batch, k, -1)
        child_lp, child_tok = torch.topk(logp, k, dim=-1)  # [B, K, K]
        child_score = (leaf_score[:, :, None] + child_lp).reshape(batch, k * k)
        child_tok = child_tok.reshape(batch, k * k)
        cand_tok.append(child_tok)
        cand_score.append(child_score)
        cand_parent.append(leaf_idx[:, :, None].expand(batch, k, k).reshape(batch, k * k))
        cand_depth.append(torch.full((batch, k * k), step, dtype=torch.long, device=device))
        if step < steps:
            best = torch.topk(child_score, k, dim=-1).indices  # [B, K]
            leaf_anc = torch.gather(leaf_anc, 1, (best // k)[:, :, None].expand(batch, k, scratch)).clone()
            leaf_anc[:, ar_k, 1 + (step - 1) * k + ar_k] = true
            leaf_tok = torch.gather(child_tok, 1, best)
            leaf_score = torch.gather(child_score, 1, best)
            leaf_idx = n_cand + best
        n_cand += k * k

    all_tok = torch.cat(cand_tok, dim=1)
    all_parent = torch.cat(cand_parent, dim=1)
    all_depth = torch.cat(cand_depth, dim=1)
    ranked = torch.cat(cand_score, dim=1) - _DEPTH_EPS * all_depth
    chosen = torch.topk(ranked, n - 1, dim=-1).indices.sort(dim=-1).values  # parents first
    node_of_cand = torch.zeros(batch, n_cand, dtype=torch.long, device=device)
    node_of_cand.scatter_(1, chosen, torch.arange(1, n, device=device).expand(batch, n - 1))
    parent_cand = torch.gather(all_parent, 1, chosen)
    parent_node = torch.where(
        parent_cand < 0, torch.zeros_like(parent_cand), torch.gather(node_of_cand, 1, parent_cand.clamp(min=0))
    )
    parents = torch.cat([torch.full((batch, 1), -1, dtype=torch.long, device=device), parent_node], dim=1)
    depth = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=device), torch.gather(all_depth, 1, chosen)], dim=1)
    tokens = torch.cat([roots[:, None], torch.gather(all_tok, 1, chosen)], dim=1)
    return VerifyTree(tokens=tokens, parents=parents, depth=depth, ancestors=_ancestors(parents, steps))


def _draft_chain(
    *, model: Model, cache: KVCache, roots: torch.Tensor, prefix: torch.Tensor, config: SpecConfig,
    key_len: Optional[int] = None,
) -> VerifyTree:
    """topk == 1: a chain of S greedy early-exit steps; same tokens as the general path."""
    device = roots.device
    batch = roots.shape[0]
    steps = config.num_steps
    rows = torch.arange(batch, device=device)
    chain = [roots]
    token = roots
    for step in range(steps):
        logits = model.forward(
            input_ids=token,
            positions=prefix + step,
            kv_rows=rows,
            kv_cols=prefix + step,
            attention=Attention.decode(prefix=prefix, visible=step + 1, dtype=model.dtype, key_len=key_len),
            cache=cache,
            num_layers=config.draft_layers,
        )
        token = logits.argmax(dim=-1)
        chain.append(token)
    n = steps + 1
    depth = torch.arange(n, device=device).expand(batch, n)
    return VerifyTree(
        tokens=torch.stack(chain, dim=1),
        parents=depth - 1,
        depth=depth,
        ancestors=torch.ones(n, n, dtype=torch.bool, device=device).tril().expand(batch, n, n),
    )


def _ancestors(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    batch, n = parents.shape
    anc = torch.eye(n, dtype=torch.long, device=parents.device).expand(batch, n, n).clone()
    cur = parents
    for _ in range(max_depth):
        valid = cur >= 0
        anc.scatter_add_(2, cur.clamp(min=0)[:, :, None], valid[:, :, None].long())
        cur = torch.where(valid, torch.gather(parents, 1, cur.clamp(min=0)), cur)
    return anc > 0


def verify_tree(
    *, model: Model, cache: KVCache, tree: VerifyTree, prefix: torch.Tensor, key_len: Optional[int] = None
) -> torch.Tensor:
    """Run every node through the full target with tree attention; ``[B, N, vocab]`` logits
    (``key_len`` as in :func:`draft_tree`)."""
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    logits = model.forward(
        input_ids=tree.tokens.reshape(-1),
        positions=(prefix[:, None] + tree.depth).reshape(-1),
        kv_rows=torch.arange(batch, device=device).repeat_interleave(n),
        kv_cols=(prefix[:, None] + torch.arange(n, device=device)[None, :]).reshape(-1),
        attention=Attention.uniform(prefix=prefix, extra=tree.ancestors, dtype=model.dtype, key_len=key_len),
        cache=cache,
        num_layers=model.num_layers,
    )
    return logits.view(batch, n, -1)


def children_lists(parents: Sequence[int]) -> list[list[int]]:
    """Node -> its children, in node order."""
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents):
        if parent >= 0:
            children[parent].append(node)
    return children


def walk_greedy(*, tokens: Sequence[int], parents: Sequence[int], target: Sequence[int]) -> tuple[list[int], int]:
    """Greedy acceptance: follow the child whose token is the target's argmax.

    Args:
        tokens: Node tokens (node 0 the root).
        parents: Node parents.
        target: The target's argmax at each node.

    Returns:
        (accepted nodes after the root, in order; the bonus token: the argmax at the last one).
    """
    children = children_lists(parents)
    node, path = 0, []
    while True:
        want = target[node]
        nxt = next((c for c in children[node] if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def walk_sampled(
    *,
    tokens: Sequence[int],
    parents: Sequence[int],
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
) -> tuple[list[int], int]:
    """Lossless acceptance for a sampled request (drafts are deterministic top-k picks).

    At each node each child's token t is accepted with probability p(t) under the filtered target
    distribution p, else removed from p and p renormalised; the bonus is drawn from what is left
    (SpecInfer's multi-candidate rule with point-mass drafts).

    Args:
        logits: ``[N, vocab]`` target logits at each node.
    """
    children = children_lists(parents)
    node, path = 0, []
    while True:
        probs = target_probs(logits[node], params).cpu()
        accepted: Optional[int] = None
        for child in children[node]:
            token = tokens[child]
            mass = float(probs.sum())
            p_token = float(probs[token]) / mass if mass > 0 else 0.0
            if p_token > 0 and float(torch.rand((), generator=generator, dtype=torch.float64)) < p_token:
                accepted = child
                break
            probs[token] = 0.0
        if accepted is None:
            return path, int(torch.multinomial(probs / probs.sum(), 1, generator=generator))
        path.append(accepted)
        node = accepted
