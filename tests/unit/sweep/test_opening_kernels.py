"""The opening's shortest chain is the shortest that runs the same kernels as the others.

SGLang 0.5.23 captures no draft-decode CUDA graph for one draft step (``eagle_worker_v2.py`` l.486-508) and its
``draft_forward`` then runs no draft forward (l.808-821): on GPUs decoding in graphs the one-step chain runs
another graph, so the opening takes two steps; on the CPU reference engine (eager) it takes one.
"""

from __future__ import annotations

import pytest

from orchestrator.space import one_step_runs_own_graph
from orchestrator.space.define_by_run import DefineByRunSpace
from orchestrator.spec import SweepSpec


def _spec(*, gpus: int | None = None, extra: dict | None = None, kind: str = "reference") -> SweepSpec:
    engine = {"kind": kind, "model_path": "ref-gpu-comm" if kind == "reference" else "some/model",
              "draft_model_path": "ref-gpu-comm-draft" if kind == "reference" else "some/draft",
              "extra_args": extra or {}}
    return SweepSpec.from_dict({
        "name": "t", "engine": engine, "search": {"speculative": {"num_steps": [1, 2, 3, 4, 5, 6], "eagle_topk": [1]}},
        **({"resources": {"gpus_per_trial": gpus}} if gpus is not None else {})})


@pytest.mark.parametrize(("spec_args", "own_graph", "shortest"), [
    ({}, False, 1),  # the CPU reference engine: no GPUs, every chain eager
    ({"gpus": 1}, True, 2),  # the GPU reference engine, decode in CUDA graphs
    ({"gpus": 1, "extra": {"cuda_graph_backend_decode": "disabled"}}, False, 1),
    ({"gpus": 1, "extra": {"disable_decode_cuda_graph": True}}, False, 1),
])
def test_the_opening_takes_the_shortest_chain_that_runs_the_others_kernels(spec_args, own_graph, shortest) -> None:
    spec = _spec(**spec_args)
    assert one_step_runs_own_graph(spec) is own_graph
    stages = dict(DefineByRunSpace(spec).opening_stages())
    assert [p.candidate.speculative.num_steps for p in stages["shortest"]] == [shortest]
    # the chains part is unchanged: SGLang's chain, then the longest
    assert [p.candidate.speculative.num_steps for p in stages["chains"]] == [3, 6]
