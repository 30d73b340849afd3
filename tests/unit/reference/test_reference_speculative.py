"""The decoding core: lossless greedy speculation, accept lengths, trees, sampling (in-process)."""

from __future__ import annotations

import collections

import pytest
import torch

from serving.reference.sampling import SamplingParams, target_probs
from serving.reference.scheduler import Scheduler
from serving.reference.speculative import SpecConfig, draft_tree, walk_greedy, walk_sampled

from helpers.reference_core import PRESET, PROMPTS, greedy_requests, run_tp

SPEC_CONFIGS = [(1, 1, 2), (3, 1, 4), (5, 4, 8), (3, 2, 6)]


@pytest.fixture(scope="module")
def baseline_tp1(tp1_models):
    return run_tp(tp1_models, greedy_requests(PROMPTS))


def test_prompt_set_is_large_enough() -> None:
    assert len(PROMPTS) >= 20


@pytest.mark.parametrize("spec", SPEC_CONFIGS, ids=lambda s: "steps%d-topk%d-draft%d" % s)
def test_greedy_speculative_equals_plain_tp1(tp1_models, baseline_tp1, spec) -> None:
    got = run_tp(tp1_models, greedy_requests(PROMPTS), spec=spec)
    for rid, tokens in baseline_tp1.items():
        assert got[rid] == tokens, f"{rid} diverged under speculation {spec}"


@pytest.mark.parametrize("spec", [None, *SPEC_CONFIGS], ids=lambda s: "plain" if s is None else "steps%d-topk%d-draft%d" % s)
def test_greedy_tp2_equals_tp1_plain(tp2_models, baseline_tp1, spec) -> None:
    """TP=2 (sharded heads and MLP, all-reduced) gives the same greedy tokens, with or without
    speculation, as TP=1 without: the model is the same function for every TP size."""
    got = run_tp(tp2_models, greedy_requests(PROMPTS), spec=spec)
    for rid, tokens in baseline_tp1.items():
        assert got[rid] == tokens, f"{rid} diverged at tp=2, spec={spec}"


def _accept_lengths(models, spec):
    """Per-cycle accept lengths (tokens emitted per verify) over the prompt set."""
    seen: list[int] = []
    state: dict[str, float] = {}

    def inspect(sched: Scheduler) -> None:
        sched._fold()
        state.update(sched.internal_state())

    original = Scheduler._spec_cycle

    def recording(self):  # type: ignore[no-untyped-def]
        before = {r.rid: len(r.output) for r in self.running}
        outs = original(self)
        for out in outs:
            seen.append(len(out.token_ids))
            assert len(out.token_ids) >= 1
            assert before[out.rid] + len(out.token_ids) <= before[out.rid] + spec[0] + 1
        return outs

    Scheduler._spec_cycle = recording  # type: ignore[method-assign]
    try:
        run_tp(models, greedy_requests(PROMPTS, max_new_tokens=48), spec=spec, inspect=inspect)
    finally:
        Scheduler._spec_cycle = original  # type: ignore[method-assign]
    return seen, state


@pytest.mark.parametrize("spec", SPEC_CONFIGS, ids=lambda s: "steps%d-topk%d-draft%d" % s)
def test_accept_length_within_bounds(tp1_models, spec) -> None:
    lengths, state = _accept_lengths(tp1_models, spec)
    assert lengths and all(1 <= n <= spec[0] + 1 for n in lengths)
    mean = sum(lengths) / len(lengths)
    assert 1.0 <= state["avg_spec_accept_length"] <= spec[0] + 1
    assert state["avg_spec_accept_length"] == pytest.approx(mean)


def test_chain_accept_length_does_not_fall_with_steps(tp1_models) -> None:
    """topk=1: more draft steps never lower the mean accept length; it saturates (grows less
    per extra step), as with a trained EAGLE head."""
    means = []
    for steps in range(1, 7):
        _, state = _accept_lengths(tp1_models, (steps, 1, steps + 1))
        means.append(state["avg_spec_accept_length"])
    assert all(b >= a for a, b in zip(means, means[1:])), means
    assert means[0] > 1.3, f"the early exit should often agree with the target: {means}"
    assert means[-1] < 6.5, f"acceptance should saturate below steps + 1: {means}"
    gains = [b - a for a, b in zip(means, means[1:])]
    assert gains[-1] < gains[0], f"gains should shrink with depth: {means}"


def test_tree_general_path_matches_chain_fast_path(tp1_models) -> None:
    """topk == 1 takes a fast path; the general tree code must draft the same chain."""
    from serving.reference.model import Attention, PrefillSpan
    from serving.reference.speculative import _draft_chain, _draft_general

    model = tp1_models[0]
    cfg = SpecConfig(num_steps=4, topk=1, num_draft_tokens=5, draft_layers=PRESET.draft_layers)
    prompts = [b"The quick brown", b"Hello, world"]
    cache = model.new_cache(max_rows=4, max_cols=256)
    cache.reserve(rows=2, cols=64)
    ids, rows, pos, spans, last = [], [], [], [], []
    for row, text in enumerate(prompts):
        tokens = [256, *text]
        spans.append(PrefillSpan(row=row, start=0, length=len(tokens), offset=len(ids)))
        ids += tokens
        rows += [row] * len(tokens)
        pos += list(range(len(tokens)))
        last.append(len(ids) - 1)
    logits = model.forward(
        input_ids=torch.tensor(ids), positions=torch.tensor(pos), kv_rows=torch.tensor(rows),
        kv_cols=torch.tensor(pos), attention=Attention(spans=spans), cache=cache,
        num_layers=model.num_layers, logits_at=torch.tensor(last),
    )
    roots = logits.argmax(-1)
    prefix = torch.tensor([len(p) + 1 for p in prompts])
    fast = _draft_chain(model=model, cache=cache, roots=roots, prefix=prefix, config=cfg)
    general = _draft_general(model=model, cache=cache, roots=roots, prefix=prefix, config=cfg)
    assert fast.tokens.tolist() == general.tokens.tolist()
    assert fast.parents.tolist() == general.parents.tolist()
    assert fast.depth.tolist() == general.depth.tolist()
    assert torch.equal(fast.ancestors, general.ancestors)


@pytest.mark.parametrize("spec", [(3, 2, 6), (5, 4, 8), (2, 3, 12)])
def test_tree_is_ancestor_closed_and_ordered(tp1_models, spec) -> None:
    model = tp1_models[0]
    cfg = SpecConfig(*spec, draft_layers=PRESET.draft_layers)
    cache = model.new_cache(max_rows=4, max_cols=256)
    cache.reserve(rows=3, cols=128)
    roots = torch.tensor([72, 101, 108])
    prefix = torch.tensor([0, 0, 0])
    tree = draft_tree(model=model, cache=cache, roots=roots, prefix=prefix, config=cfg)
    batch, n = tree.tokens.shape
    assert (batch, n) == (3, spec[2])
    for b in range(batch):
        parents = tree.parents[b].tolist()
        depth = tree.depth[b].tolist()
        assert parents[0] == -1 and depth[0] == 0
        for i in range(1, n):
            assert 0 <= parents[i] < i, "parents precede children"
            assert depth[i] == depth[parents[i]] + 1
            assert 1 <= depth[i] <= spec[0]
        anc = tree.ancestors[b]
        for i in range(n):
            chain, node = {i}, i
            while parents[node] >= 0:
                node = parents[node]
                chain.add(node)
            assert {j for j in range(n) if anc[i, j]} == chain


def test_walk_greedy_follows_target_argmax() -> None:
    tokens = [5, 7, 8, 9, 3]
    parents = [-1, 0, 0, 1, 3]
    path, bonus = walk_greedy(tokens=tokens, parents=parents, target=[7, 9, 0, 3, 4])
    assert (path, bonus) == ([1, 3, 4], 4)
    path, bonus = walk_greedy(tokens=tokens, parents=parents, target=[8, 0, 1, 0, 0])
    assert (path, bonus) == ([2], 1)
    path, bonus = walk_greedy(tokens=tokens, parents=parents, target=[6, 0, 0, 0, 0])
    assert (path, bonus) == ([], 6)


def test_walk_sampled_is_lossless() -> None:
    """Whatever the drafted children are, the first emitted token follows the target distribution."""
    torch.manual_seed(0)
    vocab = 6
    logits = torch.randn(4, vocab, dtype=torch.float64) * 1.5
    params = SamplingParams(temperature=0.8, top_k=5)
    want = target_probs(logits[0], params)
    tokens = [0, 2, 4, 1]  # root, then children 2 and 4 of the root, and 1 under 2
    parents = [-1, 0, 0, 1]
    gen = torch.Generator().manual_seed(1)
    draws = 20000
    counts: collections.Counter[int] = collections.Counter()
    for _ in range(draws):
        path, bonus = walk_sampled(tokens=tokens, parents=parents, logits=logits, params=params, generator=gen)
        counts[tokens[path[0]] if path else bonus] += 1
    for token in range(vocab):
        expected = float(want[token])
        got = counts[token] / draws
        assert abs(got - expected) < 4 * (expected * (1 - expected) / draws) ** 0.5 + 1e-3, (token, got, expected)


def test_sampled_requests_complete_and_respect_top_k(tp1_models) -> None:
    """Sampling with speculation: reproducible per seed, tokens only from the top-k set."""
    from serving.reference.protocol import GenerateReq

    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_k=3)
    reqs = [GenerateReq(rid=f"s{i}", input_ids=tuple(b"Hello there"), params=params, seed=42 + i) for i in range(4)]
    first = run_tp(tp1_models, reqs, spec=(3, 2, 6))
    again = run_tp(tp1_models, reqs, spec=(3, 2, 6))
    assert first == again
    assert all(len(t) == 24 for t in first.values())
    assert len({tuple(t) for t in first.values()}) > 1, "different seeds should give different samples"
