"""How often does greedy speculative output leave greedy plain output on real numerics, and at what gap?

The measurement behind the probe's near-tie rule (``orchestrator.bench.probe_rule``). One plain
engine writes a probe baseline (every built-in prompt, greedy, with each output token's top-5
log-probabilities); then each speculative configuration, and the plain engine itself again, is
probed against it with the near-tie rule opened wide (every flip to the baseline's runner-up is
recorded and re-anchored, whatever its gap), so the run sees:

* ``flips``: where each speculative engine took the baseline's runner-up, with the baseline's gap
  (best logprob minus runner-up's, nats) there;
* ``mismatches``: divergences that are no runner-up flip (should be none without corruption);
* ``near_ties``: how many compared positions had the baseline's best two within 0.01 ... 1 nats,
  and the flips per near tie at each such gap, with the exact 95% interval.

On a GPU (``--device cuda --dtype bfloat16``) the divergences are the hardware's own numerics:
the verify pass runs the target over several tokens at once with other kernels and batch shapes.
On the CPU (fp64, exact) add ``--perturb-verify 0.0039`` to emulate bf16 rounding of the verify pass.

JSON goes to stdout, progress to stderr::

    python benchmarks/probe_numerics.py                                            # CPU, ref-tiny
    python benchmarks/probe_numerics.py --model-path ref-gpu-comm --device cuda --dtype bfloat16 \\
        --configs 3,1,4 5,1,6 4,4,8 > docs/measurements/probe-numerics-h200x1/probe-numerics.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from reference_engine import Server, config_name, spec_flags  # noqa: E402

from orchestrator.bench.probe import ProbeBaseline, run_probe  # noqa: E402
from orchestrator.bench.probe_rule import DEFAULT_MAX_LOGPROB_GAP, flip_rate, near_ties  # noqa: E402

logger = logging.getLogger("benchmarks.probe_numerics")

GAPS = (0.01, 0.03, 0.1, 0.3, 0.5, 1.0)
WIDE_OPEN = 1e9  # nats: every runner-up flip passes and is recorded


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {f"p{int(q * 100)}": round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)
            for q in (0.01, 0.05, 0.1, 0.25, 0.5)}


def judge(name: str, url: str, baseline_path: Path, baseline: ProbeBaseline) -> dict[str, Any]:
    """Probe ``url`` against the baseline with the rule wide open; flips, mismatches and rates."""
    tic = time.monotonic()
    result = run_probe(base_url=url, baseline_path=baseline_path, rule="near_tie", max_logprob_gap=WIDE_OPEN,
                       max_flip_rate=1.0, timeout_s=600)
    gaps = sorted(flip.gap for flip in result.flips)
    compared = sum(len(o.output_ids or []) for o in baseline.outputs)
    per_gap = {}
    for gap in GAPS:
        ties = sum(near_ties(o.top_logprobs or [], o.output_ids or [], max_gap=gap) for o in baseline.outputs)
        rate = flip_rate(flips=sum(1 for g in gaps if g <= gap), near_ties=ties)
        per_gap[str(gap)] = rate.model_dump()
    logger.info("%s: %d flips, %d mismatches, largest flip gap %s (%.0f s)", name, len(gaps), len(result.mismatches),
                gaps[-1] if gaps else None, time.monotonic() - tic)
    return {
        "flips": len(gaps),
        "positions_compared": compared,
        "flip_gaps": [round(g, 5) for g in gaps],
        "largest_flip_gap": round(gaps[-1], 5) if gaps else None,
        "flips_over_default_gap": sum(1 for g in gaps if g > DEFAULT_MAX_LOGPROB_GAP),
        "flip_ranks": sorted(flip.rank for flip in result.flips),
        "flip_details": [str(flip) for flip in result.flips],
        "mismatches": [str(m) for m in result.mismatches],
        "reanchors": result.reanchors,
        "flips_per_near_tie": per_gap,
    }


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="ref-tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="--dtype of every engine (default: the preset's)")
    parser.add_argument("--configs", nargs="+", default=["3,1,4", "5,4,8"], help="steps,topk,draft per engine")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--perturb-verify", type=float, default=None,
                        help="the reference engine's perturb_verify fault on the speculative engines (CPU emulation)")
    parser.add_argument("--context-length", type=int, default=None)
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")

    common = ["--model-path", args.model_path, "--device", args.device]
    for flag, value in (("--dtype", args.dtype), ("--context-length", args.context_length),
                        ("--max-running-requests", args.max_running_requests)):
        if value is not None:
            common += [flag, str(value)]
    env = dict(os.environ)
    spec_env = dict(env)
    if args.perturb_verify is not None:
        spec_env["SPECTUNE_REFERENCE_FAULT"] = f"perturb_verify:{args.perturb_verify}"
    draft = f"{args.model_path}-draft"
    with tempfile.TemporaryDirectory(prefix="probe-numerics-") as tmp:
        log_dir = Path(tmp)
        plain = Server(name="plain", flags=[], log_dir=log_dir)
        specs = [Server(name=config_name(c), flags=[*spec_flags(c), "--speculative-draft-model-path", draft],
                        log_dir=log_dir) for c in args.configs]
        servers = [plain, *specs]
        try:
            plain.start(common, env)
            for server in specs:
                server.start(common, spec_env)
            for server in servers:
                server.wait_healthy(args.start_timeout)
            baseline_path = log_dir / "baseline.json"
            tic = time.monotonic()
            run_probe(base_url=plain.url, baseline_path=baseline_path, num_prompts=args.num_prompts,
                      max_new_tokens=args.max_new_tokens, api="generate", timeout_s=600)
            logger.info("baseline: %d prompts x %d tokens (%.0f s)", args.num_prompts, args.max_new_tokens,
                        time.monotonic() - tic)
            baseline = ProbeBaseline.model_validate_json(baseline_path.read_text())
            all_gaps = [row[0][1] - row[1][1] for o in baseline.outputs for row in o.top_logprobs or [] if len(row) > 1]
            exact_ties = sum(1 for gap in all_gaps if gap == 0)
            engines = {"plain (again)": judge("plain (again)", plain.url, baseline_path, baseline)}
            for server in specs:
                engines[server.name] = judge(server.name, server.url, baseline_path, baseline)
        finally:
            for server in servers:
                server.stop()
    largest = max((e["largest_flip_gap"] or 0.0) for e in engines.values())
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "device": args.device,
                    "gpu": _gpu_name() if args.device == "cuda" else None},
        "settings": {"model_path": args.model_path, "dtype": args.dtype, "configs": args.configs,
                     "context_length": args.context_length, "max_running_requests": args.max_running_requests,
                     "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
                     "perturb_verify": args.perturb_verify},
        "baseline_gap_quantiles": _quantiles(all_gaps),
        "baseline_positions": len(all_gaps),
        "baseline_exact_ties": exact_ties,
        "default_max_logprob_gap": DEFAULT_MAX_LOGPROB_GAP,
        "engines": engines,
        "largest_flip_gap": largest,
        "mismatches_total": sum(len(e["mismatches"]) for e in engines.values()),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a report field, never a reason to fail
        return None


if __name__ == "__main__":
    raise SystemExit(main())
