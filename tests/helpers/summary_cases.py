"""The fixed sweeps whose whole summary ``tests/unit/sweep/test_summary_pinned.py`` pins: ten trials at
concurrency 1, 8 and 32 that reach every figure of the summary (``orchestrator.sweep.output.figures``)."""

from __future__ import annotations

import statistics

from orchestrator.spec import SweepSpec
from orchestrator.statistics import log_interval
from orchestrator.sweep.confirmation.confirm import Confirmation, Contender
from orchestrator.sweep.records.results import Objective, TrialRecord
from helpers.timings import produced

LEVEL = 8
LEVELS = [1, LEVEL, 32]
OFF = {"speculative": "off", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None}
AUTO = {"speculative": "auto", "num_steps": None, "eagle_topk": None, "num_draft_tokens": None}


def spec(*, metric: str, confirmation: bool) -> SweepSpec:
    return SweepSpec.from_dict({
        "name": "pinned",
        "engine": {"kind": "reference", "model_path": "ref-tiny", "draft_model_path": "ref-tiny-draft", "tp_size": 2},
        "objective": {"metric": metric, "concurrency": LEVEL}, "benchmark": {"concurrency": LEVELS},
        "search": {"nccl_env": {"NCCL_ALGO": [None, "Ring", "Tree"], "NCCL_PROTO": [None, "Simple"]}},
        "confirmation": {"enabled": confirmation},
    })


def _chain(steps: int, **nccl: str) -> dict:
    return {"speculative": "explicit", "num_steps": steps, "eagle_topk": 1, "num_draft_tokens": steps + 1,
            "NCCL_ALGO": "default", "NCCL_PROTO": "default", **nccl}


def _trial(number: int, kind: str, label: str, params: dict, levels: dict[int, list[float]], *, metric: str,
           direction: str, status: str = "ok", reason: str | None = None, planned: int = 3,
           resolved: dict | None = None, timings: tuple[float, float] = (20.0, 50.0),
           transform=lambda v: v) -> TrialRecord:
    levels = {c: [transform(v) for v in vs] for c, vs in levels.items()}
    values = levels.get(LEVEL, [])
    interval = log_interval(values) or (None, None)
    objective = Objective(metric=metric, concurrency=LEVEL, direction=direction, values=values,
                          median=statistics.median(values), ci95_low=interval[0],
                          ci95_high=interval[1]) if values else None
    return TrialRecord(
        trial_id=f"t{number}", number=number, kind=kind, label=label, params=params, status=status,  # type: ignore[arg-type]
        reason=reason, message=f"trial {number} {status}", objective=objective,
        level_values={str(c): v for c, v in levels.items()},
        metrics={f"c{c}.{metric}": statistics.median(v) for c, v in levels.items() if v},
        repetitions_done=len(values), repetitions_planned=planned,
        measured_in_full=status in ("ok", "infeasible") and len(values) == planned, resolved_params=resolved,
        timings_s=produced(bench=timings[0], other=timings[1] - timings[0]),
        engine_config={"model_path": "ref-tiny", "trial": number},
    )


def sweep(*, metric: str = "output_tok_per_s", direction: str = "max", transform=lambda v: v) -> list[TrialRecord]:
    """Ten trials at concurrency 1, 8 and 32 (the objective's level 8)."""
    t = dict(metric=metric, direction=direction, transform=transform)
    return [
        _trial(1, "baseline_plain", "no speculation", {**OFF, "NCCL_ALGO": "default", "NCCL_PROTO": "default"},
               {1: [50.0, 51.0, 49.0], 8: [300.0, 310.0, 290.0], 32: [800.0, 805.0, 795.0]},
               timings=(31.5, 70.25), **t),
        _trial(2, "baseline_auto", "SGLang auto (= steps 3 topk 1 draft 4)",
               {**AUTO, "NCCL_ALGO": "default", "NCCL_PROTO": "default"},
               {1: [90.0, 91.0, 89.0], 8: [305.0, 295.0, 300.0], 32: [700.0, 705.0]},  # two values at 32
               resolved={"num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}, **t),
        _trial(3, "search", "steps=5 topk=1 draft=6", _chain(5),
               {1: [110.0, 112.0, 108.0], 8: [330.0, 335.0, 325.0], 32: [720.0, 725.0, 715.0]}, **t),
        _trial(4, "search", "steps=3 topk=2 draft=8",
               {"speculative": "explicit", "num_steps": 3, "eagle_topk": 2, "num_draft_tokens": 8,
                "NCCL_ALGO": "default", "NCCL_PROTO": "default"},
               {1: [100.0, 101.0, 99.0], 8: [290.0, 300.0, 310.0], 32: [690.0, 700.0, 710.0]}, **t),
        _trial(5, "search", "steps=5 topk=1 draft=6 NCCL_ALGO=Ring", _chain(5, NCCL_ALGO="Ring"),
               {1: [105.0, 106.0], 8: [320.0, 318.0, 322.0]}, **t),  # two values at 1, never measured at 32
        _trial(6, "search", "steps=2 topk=1 draft=3 NCCL_PROTO=Simple", _chain(2, NCCL_PROTO="Simple"),
               {1: [200.0, 150.0, 250.0], 8: [310.0, 240.0, 380.0], 32: [600.0, 700.0, 650.0]}, **t),  # wide
        _trial(7, "search", "steps=4 topk=1 draft=5 NCCL_ALGO=Tree", _chain(4, NCCL_ALGO="Tree"),
               {1: [130.0, 131.0, 129.0], 8: [400.0, 401.0, 399.0]}, status="infeasible", reason="slo_violated", **t),
        _trial(8, "search", "steps=6 topk=1 draft=7 NCCL_ALGO=Tree", _chain(6, NCCL_ALGO="Tree"),
               {8: [280.0]}, status="early_stopped", reason="early_stopped", **t),
        _trial(9, "search", "steps=7 topk=1 draft=8", _chain(7), {}, status="failed", reason="launch_failed",
               timings=(0.0, 12.0), **t),
        _trial(10, "search", "steps=3 topk=1 draft=4", _chain(3),
               {1: [92.0, 90.0, 91.0], 8: [299.0, 301.0, 300.0], 32: [701.0, 699.0, 700.0]}, **t),
    ]


def confirmed_by(records: list[TrialRecord], *, chosen: int, direction: str) -> Confirmation:
    by_number = {r.number: r for r in records}
    contenders = [Contender("best", by_number[3]), Contender("runner_up", by_number[6]),
                  Contender("default", by_number[2]), Contender("no_speculation", by_number[1])]
    return Confirmation(contenders=contenders, margin=0.01, direction=direction, leader=3, chosen=chosen, rounds=4,
                        vs_sglang_default={"kind": "undecided", "ratio": 1.04, "ci95_low": 0.98, "ci95_high": 1.11,
                                           "visits": 4},
                        lines=["verdict: trial 3 vs SGLang's default: undecided x1.04 [0.98, 1.11]"])


def cases() -> dict[str, tuple[SweepSpec, list[TrialRecord], Confirmation | None]]:
    confirmed = sweep()
    latency = sweep(metric="tpot_ms_p50", direction="min", transform=lambda v: round(6000.0 / v, 3))
    return {
        "confirmed_default": (spec(metric="output_tok_per_s", confirmation=True), confirmed,
                              confirmed_by(confirmed, chosen=2, direction="max")),
        "confirmation_off": (spec(metric="output_tok_per_s", confirmation=False), sweep(), None),
        "latency_min": (spec(metric="tpot_ms_p50", confirmation=False), latency, None),
    }
