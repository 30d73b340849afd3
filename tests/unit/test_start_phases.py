"""A start's phases from the engine's own log: SGLang 0.5.23's lines per TP rank, the slowest rank's
weights and its CUDA graph captures summed, the rest of the launch-to-healthy time."""

from __future__ import annotations

from orchestrator.spec import SweepSpec
from orchestrator.sweep.output.cost import start_time
from orchestrator.sweep.records.results import TrialRecord
from serving.engine.start_phases import start_phases

SGLANG_LOG = """\
[2026-12-05 10:00:01 TP0] Load weight begin. avail mem=139.20 GB
[2026-12-05 10:05:11 TP0] Load weight end. elapsed=310.42 s, type=KimiK25ForConditionalGeneration, avail mem=41.0 GB, mem usage=98.2 GB.
[2026-12-05 10:05:12 TP1] Load weight end. elapsed=318.90 s, type=KimiK25ForConditionalGeneration, avail mem=41.0 GB, mem usage=98.2 GB.
[2026-12-05 10:05:20 TP0] Memory pool end. avail mem=12.31 GB
[2026-12-05 10:06:00 TP0] Capture target decode cuda graph end. bs=[1, 2, 4, 8], elapsed=38.20 s, mem usage=1.20 GB, avail mem=11.1 GB.
[2026-12-05 10:06:20 TP0] Capture draft decode cuda graph end. bs=[1, 2, 4, 8], elapsed=19.80 s, mem usage=0.40 GB, avail mem=10.7 GB.
[2026-12-05 10:06:01 TP1] Capture target decode cuda graph end. bs=[1, 2, 4, 8], elapsed=40.00 s, mem usage=1.20 GB, avail mem=11.1 GB.
[2026-12-05 10:07:00] The server is fired up and ready to roll!
"""


def test_phases_are_the_slowest_ranks() -> None:
    assert start_phases(SGLANG_LOG, total_s=420.0) == {"weights": 318.9, "cuda_graphs": 58.0, "other": 43.1}
    assert start_phases(SGLANG_LOG, total_s=None) == {"weights": 318.9, "cuda_graphs": 58.0}
    deferred = "[2026-12-05 10:05:11 TP0] Load weight end. Committed real weights after CUDA graph capture in 12.50 s (x)"
    assert start_phases(deferred, total_s=20.0) == {"weights": 12.5, "cuda_graphs": 0.0, "other": 7.5}
    assert start_phases("no such lines", total_s=10.0) == {}


def test_the_drafts_own_weight_load_counts_as_weights() -> None:
    """SGLang 0.5.23 loads the EAGLE draft in a second model runner of each rank (eagle_worker_v2.py
    l.223-227): its own 'Load weight end' follows the target's with the same prefix."""
    log = SGLANG_LOG + (
        "[2026-12-05 10:05:20 TP0] Load weight end. elapsed=9.10 s, type=LlamaForCausalLMEagle3, avail mem=40 GB.\n"
        "[2026-12-05 10:05:21 TP1] Load weight end. elapsed=9.10 s, type=LlamaForCausalLMEagle3, avail mem=40 GB.\n")
    assert start_phases(log, total_s=420.0) == {"weights": 328.0, "cuda_graphs": 58.0, "other": 34.0}


def test_the_plan_names_where_a_warm_start_goes() -> None:
    spec = SweepSpec.from_dict({"name": "t", "engine": {"kind": "sglang", "model_path": "m", "draft_model_path": "d"}})

    def record(number: int, start: float, phases: dict[str, float]) -> TrialRecord:
        return TrialRecord(trial_id=f"t{number}", number=number, kind="search", label="x", params={}, status="ok",
                           node_id="n1", started_at=f"2026-12-05T20:{number:02d}:00+00:00",
                           timings_s={"engine_start": start}, start_phases_s=phases)

    records = [record(1, 1200.0, {"weights": 900.0, "cuda_graphs": 60.0, "other": 240.0}),
               record(2, 600.0, {"weights": 360.0, "cuda_graphs": 60.0, "other": 180.0}),
               record(3, 620.0, {"weights": 380.0, "cuda_graphs": 60.0, "other": 180.0})]
    seconds, basis = start_time(spec, records)
    assert seconds == 610.0
    assert basis == ("measured, median of 2 warm starts (node n1, 2026-12-05): weights 6m10s, CUDA graphs 1m00s, other 3m00s; the cold "
                     "first start took 20m00s")
