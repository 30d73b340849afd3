"""A human- and machine-readable summary of a sweep spec (what ``spectune validate`` prints, and the sweep logs).

Kept apart from the CLI so the summary can be logged by the sweep and tested without a terminal.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.space import SpeculativeList, preset_label
from orchestrator.spec import SweepSpec
from orchestrator.sweep.confirmation.margin import confirmation_margin
from serving.redaction import REDACTED, redact

__all__ = ["describe_spec", "sweep_params"]


MAX_LISTED = 8
"""Listed points (triples, NCCL presets) shown by name before the rest are counted."""


def _listed(labels: list[str], sep: str) -> str:
    """``a, b, c`` — or the first ``MAX_LISTED`` and ``... (+N more)``, so a long list stays one line."""
    if len(labels) <= MAX_LISTED:
        return sep.join(labels)
    return sep.join(labels[:MAX_LISTED]) + f"{sep}... (+{len(labels) - MAX_LISTED} more)"


def _shown_uri(uri: str) -> str:
    """``uri`` with the password of its user part hidden (``postgresql://me:<redacted>@db/mlflow``)."""
    try:
        parts = urlsplit(uri)
        if parts.password is None:
            return uri
    except ValueError:  # not a URL (a bad port, say): shown as written, nothing to find in it
        return uri
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}"))


def describe_spec(spec: SweepSpec) -> dict[str, Any]:
    """Summarise the space and settings of ``spec``.

    Returns:
        ``{"name", "dimensions": [{"name", "values", "count"}], "valid_configurations", "text": {...},
        "warnings": [...]}`` where ``text`` holds one readable line per section and ``warnings`` the
        settings that cannot give an interval (``SweepSpec.warnings``).
    """
    dimensions: list[dict[str, Any]] = []
    engine = spec.engine
    space = spec.space()
    if engine.speculative_algorithm is None:
        dimensions.append({"name": "speculative", "values": "off", "count": 1})
    elif spec.search.speculative is None:
        dimensions.append({"name": "speculative", "values": "SGLang auto choice", "count": 1})
    else:
        numbers = space.speculative  # counted and summarised without listing its points
        auto = " + auto" if numbers.include_auto else ""
        if isinstance(numbers, SpeculativeList):
            values = _listed([f"({t.num_steps},{t.eagle_topk},{t.num_draft_tokens})" for t in numbers.triples], ", ")
        else:  # as the spec wrote them; values SGLang's rules leave out are a warning (SweepSpec.warnings)
            values = spec.search.speculative.values_text()
        dimensions.append({"name": "speculative (steps, topk, draft)", "values": values + auto, "count": len(numbers)})
    arms = spec.arms_on_node()
    merged = {arm: to for arm, to in arms.stands_for.items() if arm != to}
    arm_values = ", ".join(arms.measured) + (
        " (" + ", ".join(f"{a} = {to}" for a, to in merged.items()) + " on " + str(arms.gpu_kind) + ")" if merged else "")
    dimensions.append({"name": "all_reduce", "values": arm_values, "count": len(arms.measured)})
    nccl_where = "" if arms.nccl_arms is None or set(arms.nccl_arms) == set(arms.measured) else (
        f" (on {', '.join(arms.nccl_arms)} only)" if arms.nccl_arms else " (on no arm)")
    for name, choices in sorted(spec.search.nccl_env.items()):
        shown = ", ".join("default" if c is None else c for c in choices)
        dimensions.append({"name": name, "values": shown + nccl_where, "count": len(choices)})
    if space.nccl_presets is not None:
        shown = _listed([preset_label(p) for p in space.nccl_presets], "; ")
        dimensions.append({"name": "nccl_presets", "values": shown + nccl_where, "count": len(space.nccl_presets)})

    bench = spec.benchmark
    slo = spec.objective.slo.limits()
    fixed_env = ", ".join(f"{k}={redact(k, v)}" for k, v in sorted(engine.env.items())) or "none"
    text = {
        "engine": (
            f"{engine.kind} model={engine.model_path} tp={engine.tp_size} "
            + (f"nnodes={engine.nnodes} ({engine.tp_size // engine.nnodes} ranks a node) " if engine.nnodes > 1 else "")
            + f"speculative={engine.speculative_algorithm or 'off'}"
            + (f" draft={engine.draft_model_path}" if engine.speculative_algorithm else "")
            + f"; fixed env: {fixed_env}"
        ),
        "objective": (
            f"{spec.objective.metric} ({spec.objective.direction}) at concurrency {spec.objective_concurrency}"
            + (f"; SLO {', '.join(f'{k} <= {v}' for k, v in slo.items())}" if slo else "")
        ),
        "benchmark": (
            f"{bench.dataset} prompts x{bench.num_prompts}, {bench.output_len} output tokens, concurrency "
            f"{bench.concurrency}, {bench.warmup_requests} warm-up + {bench.repetitions} repetitions"
            + (f" of at least {bench.min_repetition_s:g} s" if bench.min_repetition_s else "")
            + f", temperature {bench.temperature}, seed {bench.seed}"
        ),
        "confirmation": (
            f"the search's best {spec.confirmation.top_k}, SGLang's default"
            + (" and no speculation, " if spec.confirmation.no_speculation else " (no speculation not visited), ")
            + f"{spec.confirmation.min_visits}-{spec.confirmation.max_visits} interleaved visits each "
            f"({spec.confirmation.repetitions_per_visit} repetition(s) a visit), margin {confirmation_margin(spec):.1%}"
            if spec.confirmation.enabled else "off"
        ),
        "budget": (
            f"{spec.budget.num_trials} trials, {spec.budget.max_concurrent_trials} at a time, "
            f"{spec.gpus_per_trial} GPU(s) + {spec.resources.cpus_per_trial} CPU(s) each"
            + (f", stop after {spec.budget.time_limit_s:g} s" if spec.budget.time_limit_s else "")
        ),
        "tracking": f"MLflow {_shown_uri(spec.mlflow_uri())} experiment {spec.experiment_name!r}",
        "all_reduce": (f"on {arms.gpu_kind}: " if arms.gpu_kind else "") + "; ".join(arms.lines()),
    }
    return {
        "name": spec.name,
        "dimensions": dimensions,
        "valid_configurations": len(space),
        "text": text,
        "warnings": spec.warnings(),
    }


def sweep_params(spec: SweepSpec) -> dict[str, Any]:
    """The sweep's MLflow parent run's params: the spec's key settings, all fixed by the spec (so
    a resumed sweep logs the same values); settings the spec leaves out are left out."""
    engine, summary = spec.engine, describe_spec(spec)
    params = {
        "sweep.name": spec.name,
        "engine.kind": engine.kind,
        "engine.model_path": engine.model_path,
        "engine.draft_model_path": engine.draft_model_path if engine.speculative_algorithm else None,
        "engine.speculative_algorithm": engine.speculative_algorithm or "off",
        "engine.tp_size": engine.tp_size,
        "engine.nnodes": engine.nnodes if engine.nnodes > 1 else None,  # one node: as before, no param
        "objective.metric": spec.objective.metric,
        "objective.direction": spec.objective.direction,
        "objective.concurrency": spec.objective_concurrency,
        "budget.num_trials": spec.budget.num_trials,
        "budget.max_concurrent_trials": spec.budget.max_concurrent_trials,
        "search.dimensions": "; ".join(f"{d['name']}: {d['values']}" for d in summary["dimensions"]),
        "search.valid_configurations": summary["valid_configurations"],
    }
    return {k: v for k, v in params.items() if v is not None}  # the tracker would show None as "default"
