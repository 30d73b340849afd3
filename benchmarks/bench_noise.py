"""Benchmark the benchmark: how much the old and the new procedure's repetitions disagree, side by side.

On the CPU reference engine (``ref-tiny``, EAGLE3 with ``ref-tiny-draft``, 3 steps, top-k 1,
4 draft tokens, tp 1) this measures, in one run, two ways of benchmarking concurrency levels 1 and 4:

* **old**: one warm-up of ``--old-warmup`` requests at the highest level, then exactly
  ``--old-repetitions`` repetitions per level (what ``spectune bench`` did before issue 10);
* **new**: the library's defaults: each level warmed at its own concurrency until two windows agree
  on tok/s, then repeated until the 95% interval of output tok/s (of its geometric mean, log scale)
  is within a factor 1.02 of it (at least 3, at most 10 repetitions).

Each procedure run gets a freshly started engine, as a sweep trial does (a warm engine would hide
exactly what warm-up is for), and the runs are interleaved: old, new, new, old, old, new, ... so
the machine's drift and the other load on it hit both alike (the 1-minute load average before and
after each run is reported, since a shared machine's load is most of its noise). Per procedure and
level it reports:

* ``cv``: stdev / mean of output tok/s across the repetitions of one run (mean over runs);
* ``first_rep_vs_rest``: the first repetition's tok/s / the median of the others (a cold first
  repetition shows as < 1);
* ``repetitions``, ``target_met``, ``ci_rel`` (``noise.ci_rel``: exp(log-scale half-width) - 1; runs
  recorded before issue 28 hold the arithmetic half-width / median), ``drift``;
* ``warmup_requests`` / ``warmup_s`` / ``warmup_converged`` and the whole run's ``seconds``;

and per level ``cv_ratio_new_over_old`` (below 1: the new procedure's repetitions agree better).

JSON goes to stdout, progress to stderr::

    python benchmarks/bench_noise.py                       # 2 rounds, 32 prompts x 128 tokens
    python benchmarks/bench_noise.py --rounds 3 --num-prompts 16 --output-len 64
    python benchmarks/bench_noise.py --model-path ref-gpu-comm --device cuda    # the GPU preset

On a shared machine the other load can dwarf what this compares (2 cores at a load average of 2-17
gave 69-432 tok/s at concurrency 1 between runs): read ``loadavg_1min_before_after`` first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.bench.metrics import Distribution  # noqa: E402
from orchestrator.bench.report import BenchResult  # noqa: E402
from orchestrator.bench.runner import arun_benchmark, open_benchmark, run_level, warm_up_level  # noqa: E402
from orchestrator.bench.settings import BenchSettings  # noqa: E402
from serving.engine.config import EngineConfig  # noqa: E402
from serving.engine.process import EngineProcess  # noqa: E402

logger = logging.getLogger("benchmarks.bench_noise")

LEVELS = [1, 4]
PROCEDURES = ("old", "new")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The reference engine (default: ``ref-tiny`` on the CPU, whatever GPUs the host has) with
    SGLang's default EAGLE-3 chain for this architecture and the preset's own draft (``<preset>-draft``)."""
    return EngineConfig(
        kind="reference", model_path=args.model_path, tp_size=1, speculative_algorithm="EAGLE3",
        speculative_draft_model_path=f"{args.model_path}-draft",
        speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4,
        extra_args={"device": args.device},
    )


def settings_for(procedure: str, args: argparse.Namespace, **overrides: Any) -> BenchSettings:
    """The settings of one procedure: the same prompts either way, only warm-up and repetitions differ."""
    base: dict[str, Any] = dict(num_prompts=args.num_prompts, output_len=args.output_len, concurrency=LEVELS,
                                request_timeout_s=300.0)
    if procedure == "old":
        base.update(warmup_requests=0, warmup={"tolerance": None}, repetitions=args.old_repetitions,
                    target_ci_rel=None)
    return BenchSettings(**{**base, **overrides})


async def run_old(url: str, args: argparse.Namespace) -> BenchResult:
    """The old procedure from the new steps: one fixed warm-up at the highest level, then every level
    with no warm-up of its own and a fixed number of repetitions."""
    warm = settings_for("old", args, warmup_requests=args.old_warmup)
    async with open_benchmark(base_url=url, settings=warm) as run:
        await warm_up_level(run, concurrency=max(LEVELS))
    async with open_benchmark(base_url=url, settings=settings_for("old", args)) as run:
        for concurrency in LEVELS:
            await run_level(run, concurrency=concurrency)
        return run.result()


async def run_new(url: str, args: argparse.Namespace) -> BenchResult:
    """The new procedure: the library's defaults."""
    return await arun_benchmark(base_url=url, settings=settings_for("new", args))


def measure(procedure: str, args: argparse.Namespace, log_dir: Path) -> tuple[BenchResult, float]:
    """Start a fresh engine, run ``procedure`` on it, stop it; the result and the procedure's seconds."""
    engine = EngineProcess.from_config(engine_config(args), log_dir=log_dir, start_timeout_s=300, die_with_parent=True)
    with engine:
        tic = time.perf_counter()
        result = asyncio.run((run_old if procedure == "old" else run_new)(engine.url, args))
        return result, time.perf_counter() - tic


def level_facts(result: BenchResult, concurrency: int) -> dict[str, Any]:
    """What one run says about one level."""
    level = result.level(concurrency)
    rates = [rep.output_tok_per_s for rep in level.repetitions if rep.output_tok_per_s is not None]
    rest = statistics.median(rates[1:]) if len(rates) > 1 else None
    warmup = level.warmup
    return {
        "tok_per_s": [round(r, 2) for r in rates],
        "median_tok_per_s": round(statistics.median(rates), 2),
        "cv": Distribution.of(rates).cv,
        "first_rep_vs_rest": rates[0] / rest if rest else None,
        "repetitions": level.repetitions_used,
        "target_met": level.target_met,
        "ci_rel": level.ci_rel,
        "drift": level.drift.direction if level.drift else None,
        "drift_p": level.drift.p_value if level.drift else None,
        "warmup_requests": warmup.num_requests if warmup else 0,
        "warmup_s": round(warmup.duration_s or 0.0, 2) if warmup else 0.0,
        "warmup_converged": warmup.converged if warmup else None,
    }


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per procedure and level: the mean over runs of each run's figures, plus the runs themselves."""
    out: dict[str, Any] = {}
    for procedure, facts in runs.items():
        per_level = {}
        for concurrency in LEVELS:
            rows = [f["levels"][concurrency] for f in facts]
            per_level[f"c{concurrency}"] = {
                "cv": _mean([r["cv"] for r in rows]),
                "first_rep_vs_rest": _mean([r["first_rep_vs_rest"] for r in rows]),
                "repetitions": [r["repetitions"] for r in rows],
                "target_met": [r["target_met"] for r in rows],
                "ci_rel": [r["ci_rel"] for r in rows],
                "drift": [r["drift"] for r in rows],
                "warmup_requests": [r["warmup_requests"] for r in rows],
                "warmup_s": [r["warmup_s"] for r in rows],
                "warmup_converged": [r["warmup_converged"] for r in rows],
                "median_tok_per_s": [r["median_tok_per_s"] for r in rows],
                "tok_per_s": [r["tok_per_s"] for r in rows],
            }
        out[procedure] = {"levels": per_level, "seconds": [round(f["seconds"], 1) for f in facts],
                          "loadavg_1min_before_after": [f["loadavg"] for f in facts]}
    out["cv_ratio_new_over_old"] = {
        f"c{c}": (new / old if new is not None and old else None)
        for c in LEVELS
        for new, old in [(out["new"]["levels"][f"c{c}"]["cv"], out["old"]["levels"][f"c{c}"]["cv"])]
    }
    return out


def describe_new(settings: BenchSettings) -> str:
    warmup, (fewest, most) = settings.warmup, settings.repetition_bounds()
    return (
        f"per level: {settings.warmup_requests} warm-up requests, then windows until tok/s is stable within "
        f"{warmup.tolerance:.0%} (at most {warmup.max_windows}); repetitions until the 95% interval is within "
        f"{settings.target_ci_rel:.0%} of the geometric mean ({fewest}-{most})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each procedure (interleaved).")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--old-warmup", type=int, default=4, help="The old procedure's one warm-up (requests).")
    parser.add_argument("--old-repetitions", type=int, default=5, help="The old procedure's repetitions per level.")
    parser.add_argument("--model-path", default="ref-tiny", help="Reference-engine preset (ref-gpu-comm on a GPU).")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("orchestrator.bench.runner").setLevel(logging.INFO)
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PROCEDURES}
    # old new | new old | old new ...: each procedure goes first as often as the other
    order = [p for r in range(args.rounds) for p in (PROCEDURES if r % 2 == 0 else PROCEDURES[::-1])]
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        for index, procedure in enumerate(order):
            logger.info("run %d/%d: %s procedure on a fresh engine", index + 1, len(order), procedure)
            load_before = os.getloadavg()[0]
            result, seconds = measure(procedure, args, Path(tmp) / f"{index}-{procedure}")
            runs[procedure].append({"seconds": seconds, "levels": {c: level_facts(result, c) for c in LEVELS},
                                    "loadavg": [round(load_before, 1), round(os.getloadavg()[0], 1)]})
    report = {
        "engine": engine_config(args).model_dump(include={"model_path", "speculative_draft_model_path",
                                                           "speculative_num_steps", "speculative_eagle_topk",
                                                           "speculative_num_draft_tokens", "tp_size", "extra_args"}),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "prompts": args.num_prompts, "output_len": args.output_len, "rounds": args.rounds, "order": order,
        "old": f"{args.old_warmup} warm-up requests at c={max(LEVELS)} once, "
               f"{args.old_repetitions} repetitions per level",
        "new": describe_new(settings_for("new", args)),
        **summarise(runs),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
