"""What can be checked before bed, is: the mistakes a spec can hold that only a night would find.

:func:`before_bed` reads the spec, the files it names on this machine, and nothing else (no Ray, no
GPU query, no network), and returns findings; ``spectune validate`` and ``spectune sweep --dry-run``
print them and refuse a spec with an error (exit 2). Three checks:

- **traffic**: ``benchmark.dataset_path`` exists, parses (``orchestrator.bench.request_log``), and its
  fingerprint is shown: the file's hash, its requests, replayable and not, by reason. It is the
  fingerprint every trial records (``orchestrator.sweep.execution.traffic_setup.read_traffic``).
- **GPUs**: the GPUs one engine uses (tp_size x pp_size x dp_size, SGLang's own count) against
  ``resources.gpus_per_trial``: fewer reserved cannot run; more reserved leaves GPUs idle all night.
- **attention heads**: the attention-TP size (tp_size / attn_dp_size / attn_cp_size) divides the
  model's and the draft's ``num_attention_heads`` (and fits their ``num_key_value_heads``), read
  from config.json where it is on this machine (a local directory or the Hugging Face cache; a
  reference preset's shape); SGLang refuses the rest when it loads the model, minutes into a start.

The SGLang rules, read from SGLang 0.5.23 (``python/sglang/...``):

- GPUs one engine uses: ``srt/server_args.py:581-589`` ``compute_world_size`` = dp_size x tp_size x
  pp_size ("Attention DP runs inside the TP group, so it adds no GPUs");
  ``srt/managers/data_parallel_controller.py:420-448`` gives each DP replica tp_size x pp_size GPUs from
  GPU 0 up. Extra visible GPUs are never refused: they are left idle.
- attention DP is ``--attn-dp-size`` (the spec refuses the deprecated ``--enable-dp-attention``,
  which ``srt/arg_groups/parallel_hook.py:63-82`` turns into it).
- attention-TP size = tp_size // attn_dp_size // attn_cp_size: ``srt/runtime_context.py:73-76``;
  tp_size must be a multiple of attn_dp_size (x attn_cp_size): ``parallel_hook.py:159-164, 326``.
- heads: ``srt/models/deepseek_v2.py:2057`` ``assert num_heads % attn_tp_size == 0`` (MLA models:
  DeepSeek, Kimi-K2.5); ``srt/layers/linear.py:1139-1145`` ``QKVParallelLinear``:
  ``divide(total_num_heads, tp_size)``, and KV heads divided by, or dividing, the TP size
  (``srt/distributed/utils.py:68-79``: an assert). Padding of unaligned heads is for CPU only
  (``srt/model_executor/model_runner.py:1301-1304``).
- the draft is split over the same attention-TP group, or the whole TP group under attention CP
  without attention DP: ``srt/runtime_context.py:489-498``, ``srt/speculative/draft_parallel.py:53-67``.
- which config is read: ``srt/utils/hf_transformers/common.py:547-590`` ``get_hf_text_config``
  (thinker_config > llm_config > language_config > text_config > the config itself);
  ``srt/configs/model_config.py:1545-1550`` reads ``num_attention_heads`` and ``num_key_value_heads``
  from it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from orchestrator.errors import SpecError, SpecProblem
from orchestrator.spec import SweepSpec

__all__ = ["Finding", "NotReadyError", "before_bed", "finding_lines", "gpu_findings", "heads_findings",
           "traffic_findings"]

Level = Literal["error", "warning", "note"]
"""``error``: the night cannot run as written (validate and the dry run exit 2); ``warning``: it runs
and wastes or misleads; ``note``: what was read, or what could not be checked here."""

_DATASET_FIELD = "benchmark.dataset_path"

_EXPECTED_FILE = {
    "request_log": "an OpenAI-format JSONL request log (one chat or completions request a line)",
    "sharegpt": "a ShareGPT-format JSON file",
}

_TEXT_CONFIGS = ("thinker_config", "llm_config", "language_config", "text_config")
"""Sub-configs that hold a multimodal model's language model, in SGLang's order of priority
(``get_hf_text_config``); a ``thinker_config`` holds its own ``text_config``."""


@dataclass(frozen=True)
class Finding:
    """One thing :func:`before_bed` found.

    Attributes:
        level: ``error``, ``warning`` or ``note`` (see :data:`Level`).
        field: Dotted path of the spec field it is about, e.g. ``benchmark.dataset_path``.
        message: What was found, the value, and what is allowed or what to do.
    """

    level: Level
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class NotReadyError(SpecError):
    """A spec valid on its own whose night cannot run (a finding of level ``error``): the spec's
    problems are the error findings."""

    def __init__(self, findings: list[Finding], *, source: str = "") -> None:
        super().__init__([SpecProblem(f.field, f.message) for f in findings if f.level == "error"], source=source)


def before_bed(spec: SweepSpec, *, env: Mapping[str, str] | None = None) -> list[Finding]:
    """Every before-bed finding of ``spec``: traffic, GPUs, attention heads (in that order).

    Args:
        spec: The validated spec.
        env: The environment whose Hugging Face cache variables locate a hub id's config.json
            (default ``os.environ``); the engine's own ``engine.env`` cache variables win, as on the
            engine's node.
    """
    return [*traffic_findings(spec), *gpu_findings(spec), *heads_findings(spec, env=env)]


def finding_lines(findings: list[Finding]) -> list[str]:
    """One line a finding, as validate and the dry run print them: ``error benchmark.dataset_path: ...``."""
    return [f"{f.level} {f}" for f in findings]


# --- traffic ---------------------------------------------------------------------------------------


def traffic_findings(spec: SweepSpec) -> list[Finding]:
    """``benchmark.dataset_path``: an error when the file is missing or does not parse, else a note
    with its fingerprint (``TrafficFingerprint.short``) and the warnings a sweep would log about it.
    A relative path is read from the current directory, as the sweep reads it when it starts."""
    from orchestrator.bench.datasets import DatasetError
    from orchestrator.sweep.execution.traffic_setup import read_traffic

    bench = spec.benchmark
    if not bench.dataset_path:
        return []
    given = bench.dataset_path
    path = Path(given).expanduser()
    expected = _EXPECTED_FILE.get(bench.dataset, "a dataset file")
    where = "" if path.is_absolute() else f" (a relative path is read from where the command runs: {Path.cwd()})"
    if not path.exists():
        return [Finding("error", _DATASET_FIELD, f"{given!r} does not exist{where}; expected {expected}")]
    if not path.is_file():
        return [Finding("error", _DATASET_FIELD, f"{given!r} is not a file{where}; expected {expected}")]
    try:
        traffic, warnings = read_traffic(spec)
    except DatasetError as exc:  # names the file, what is wrong and what is expected
        return [Finding("error", _DATASET_FIELD, str(exc))]
    shown = [Finding("note", _DATASET_FIELD, f"as read now: {traffic.short()}; every trial records this fingerprint")]
    return shown + [Finding("warning", _DATASET_FIELD, line.removeprefix(f"{_DATASET_FIELD}: ")) for line in warnings]


# --- GPUs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """One engine's parallel sizes as SGLang resolves them (attention DP folded out of dp_size)."""

    tp: int
    pp: int = 1
    dp: int = 1
    attn_dp: int = 1
    attn_cp: int = 1

    @property
    def gpus(self) -> int:
        """GPUs the engine uses (``compute_world_size``)."""
        return self.dp * self.tp * self.pp

    @property
    def attn_tp(self) -> int:
        """The attention-TP size heads are split over (``derive_attn_tp_size``)."""
        return self.tp // self.attn_dp // self.attn_cp

    def shape(self) -> str:
        """``tp_size 6``, ``tp_size 4 x pp_size 2``: the factors of :attr:`gpus` that are set."""
        extra = [f"{name} {size}" for name, size in (("pp_size", self.pp), ("dp_size", self.dp)) if size > 1]
        return " x ".join([f"tp_size {self.tp}", *extra])


def _size(flags: Mapping[str, Any], name: str) -> int:
    value = flags.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _layout(spec: SweepSpec) -> _Layout:
    """The engine's layout: the reference engine has tensor parallelism only; SGLang's pp_size,
    dp_size, attn_dp_size, attn_cp_size come from ``engine.extra_args`` (1 when unset)."""
    engine = spec.engine
    if engine.kind != "sglang":
        return _Layout(tp=engine.tp_size)
    flags = engine.extra_args
    return _Layout(tp=engine.tp_size, pp=_size(flags, "pp_size"), dp=_size(flags, "dp_size"),
                   attn_dp=_size(flags, "attn_dp_size"), attn_cp=_size(flags, "attn_cp_size"))


def gpu_findings(spec: SweepSpec) -> list[Finding]:
    """``resources.gpus_per_trial`` against the GPUs one engine uses: an error where the engine needs
    more than the trial holds (tp_size alone is the spec's own check), a warning where GPUs sit idle;
    and an error where tp_size is not a multiple of the attention-DP x CP size (SGLang asserts it)."""
    reserved = spec.gpus_per_trial
    if reserved == 0:  # the reference engine on CPUs
        return []
    layout = _layout(spec)
    findings: list[Finding] = []
    groups = layout.attn_dp * layout.attn_cp
    if layout.tp % groups:
        findings.append(Finding(
            "error", "engine.tp_size",
            f"{layout.tp} is not a multiple of attn_dp_size x attn_cp_size = {groups} (engine.extra_args); SGLang "
            "refuses it at start (srt/arg_groups/parallel_hook.py:162, 326); use a tp_size that is a multiple of "
            f"{groups}"))
        return findings
    used = layout.gpus
    if used > reserved and not (spec.engine.kind == "sglang" and layout.tp > reserved):  # else the spec's own check
        findings.append(Finding(
            "error", "resources.gpus_per_trial",
            f"{reserved} GPU(s) reserved per trial, and the engine needs {used} ({layout.shape()}; SGLang's count "
            f"dp x tp x pp, srt/server_args.py:581-589): its ranks past GPU {reserved - 1} have no GPU; set "
            f"resources.gpus_per_trial: {used}, or sizes whose product is {reserved}"))
    elif used < reserved:
        idle = reserved - used
        findings.append(Finding(
            "warning", "resources.gpus_per_trial",
            f"{reserved} GPUs reserved per trial, and the engine uses {used} ({layout.shape()}): {idle} GPU(s) sit "
            f"idle in every trial. SGLang does not refuse this (it uses dp x tp x pp GPUs from the first, "
            f"srt/server_args.py:581-589), so the night measures a {used}-GPU engine; set resources.gpus_per_trial: "
            f"{used}, or engine sizes that use all {reserved}"))
    return findings


# --- attention heads -------------------------------------------------------------------------------


def heads_findings(spec: SweepSpec, *, env: Mapping[str, str] | None = None) -> list[Finding]:
    """The attention-TP size against the heads of the model and the draft (both are split over the
    same TP group): an error where it does not divide them, a note where a config.json is not on
    this machine (not checked). The reference engine: its preset's shape (``ModelPreset.check_tp``,
    which the engine runs at start). Skipped where tp_size is not a multiple of the attention-DP x CP
    size (:func:`gpu_findings` says so)."""
    engine = spec.engine
    layout = _layout(spec)
    if layout.tp % (layout.attn_dp * layout.attn_cp) or layout.tp == 1:
        return []
    if engine.kind == "reference":
        from serving.reference.config import get_preset

        try:
            preset = get_preset(engine.model_path)
        except ValueError:  # not a preset: the sweep's preflight names it
            return []
        try:
            preset.check_tp(layout.tp)
        except ValueError as exc:
            return [Finding("error", "engine.tp_size", f"{layout.tp}: {exc} (the reference engine refuses it at start)")]
        return []
    environ = {**(os.environ if env is None else env),
               **{k: v for k, v in engine.env.items() if k in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")}}
    findings: list[Finding] = []
    sources = [("engine.model_path", engine.model_path)]
    if engine.speculative_algorithm and engine.draft_model_path:
        sources.append(("engine.draft_model_path", engine.draft_model_path))
    for field, model in sources:
        found = _local_config(model, environ)
        if found is None:
            findings.append(Finding(
                "note", field,
                f"{model}: attention heads not checked against engine.tp_size {layout.tp}: its config.json is not on "
                "this machine (a local directory or the Hugging Face cache; nothing is downloaded to check)"))
            continue
        config, where = found
        # a draft runs on the full TP group under CP without attention DP, else on attention TP
        # (srt/runtime_context.py:489-498, srt/speculative/draft_parallel.py:53-67)
        full_tp = field == "engine.draft_model_path" and layout.attn_cp > 1 and layout.attn_dp == 1
        problem = _heads_problem(_text_config(config), layout, size=layout.tp if full_tp else layout.attn_tp)
        if problem:
            what, why, fix = problem
            findings.append(Finding("error", "engine.tp_size", f"{layout.tp} {what} of {field} {model} ({where}): "
                                    f"SGLang refuses it when it loads the model, minutes into every start ({why}); {fix}"))
    return findings


def _heads_problem(config: Mapping[str, Any], layout: _Layout, *, size: int) -> tuple[str, str, str] | None:
    """(what splitting over ``size`` ranks breaks in this text config, SGLang's lines, the fix), or
    None (no heads listed: nothing to split)."""
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int) or isinstance(heads, bool) or heads < 1:
        return None
    named = "an attention-TP size" if size != layout.tp else "a tp_size"
    shown = f" (its attention-TP size {size} = tp_size / attn_dp_size / attn_cp_size)" if size != layout.tp else ""
    if heads % size:
        fits = ", ".join(str(d) for d in range(1, min(heads, 64) + 1) if heads % d == 0)
        return (f"does not divide num_attention_heads {heads}{shown}",
                "srt/models/deepseek_v2.py:2057, srt/layers/linear.py:1139", f"use {named} that divides {heads}: {fits}")
    kv = config.get("num_key_value_heads")
    if isinstance(kv, int) and not isinstance(kv, bool) and kv >= 1 and (kv % size if kv >= size else size % kv):
        return (f"and num_key_value_heads {kv} do not divide one another{shown}",
                "the KV heads are split or replicated evenly over the ranks, srt/layers/linear.py:1140-1145",
                f"use {named} that divides {kv} or is a multiple of it")
    return None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config.json, as SGLang picks it (``get_hf_text_config``)."""
    for key in _TEXT_CONFIGS:
        sub = config.get(key)
        if isinstance(sub, dict):
            inner = sub.get("text_config") if key == "thinker_config" else None
            return inner if isinstance(inner, dict) else sub
    return config


def _local_config(model: str, env: Mapping[str, str]) -> tuple[dict[str, Any], str] | None:
    """(config.json's contents, where it was read) for a local model directory or a hub id whose
    snapshot of ``main`` is in the Hugging Face cache; None where neither is on this machine or it
    does not parse as a JSON object."""
    from serving.engine.hub_cache import cached_snapshot
    from serving.engine.node_checks import HUB_ID

    local = Path(model).expanduser()
    snapshot = local if local.is_dir() else cached_snapshot(model, env) if HUB_ID.match(model) else None
    if snapshot is None:
        return None
    file = snapshot / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (config, f"config.json at {file}") if isinstance(config, dict) else None
