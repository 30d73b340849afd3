"""The sweep's traffic, pinned at its start: the dataset file kept with the results, its fingerprint,
and what a person should know about it.

A sweep reads its prompts in every trial, on whichever node runs the trial, long after the driver
started (and ``ray job submit`` may remove its copy of the working directory meanwhile). So the
driver copies a dataset file (a request log, a ShareGPT file) into ``RESULTS_DIR/traffic/`` once,
points the spec at the copy (an absolute path), and fingerprints it (``orchestrator.bench.traffic``):
every trial records that fingerprint, the sweep's MLflow run logs it as params and the file as an
artifact, and ``best.yaml``'s provenance names it. A resumed sweep keeps its copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from orchestrator.bench.datasets import Prompt
from orchestrator.bench.request_log import load_dataset, load_request_log, sample_requests
from orchestrator.bench.traffic import TrafficFingerprint, fingerprint
from orchestrator.spec import SweepSpec

__all__ = ["TRAFFIC_DIR", "pin_dataset", "read_traffic"]

TRAFFIC_DIR = "traffic"
"""Under the results directory: the sweep's own copy of its dataset file."""


def pin_dataset(spec: SweepSpec, results_dir: Path, *, resume: bool) -> SweepSpec:
    """``spec`` reading its dataset file from ``results_dir/traffic/NAME`` (copied there now; a resumed
    sweep keeps the copy it made). Specs without a dataset file are returned as they are.

    Raises:
        orchestrator.bench.datasets.DatasetError: the file does not exist (a new sweep).
    """
    from orchestrator.bench.datasets import DatasetError

    source = spec.benchmark.dataset_path
    if not source:
        return spec
    pinned = results_dir / TRAFFIC_DIR / Path(source).name
    if not (resume and pinned.is_file()):
        path = Path(source).expanduser()
        if not path.is_file():
            raise DatasetError(f"benchmark.dataset_path {source!r} does not exist (looked in {Path.cwd()}); "
                               "give the file's path, absolute or relative to where the sweep starts")
        pinned.parent.mkdir(parents=True, exist_ok=True)
        if path.resolve() != pinned.resolve():
            shutil.copyfile(path, pinned)
    benchmark = spec.benchmark.model_copy(update={"dataset_path": str(pinned.resolve())})
    return spec.model_copy(update={"benchmark": benchmark})


def read_traffic(spec: SweepSpec) -> tuple[TrafficFingerprint, list[str]]:
    """What every trial of ``spec`` benchmarks, read once: the prompts one repetition sends,
    fingerprinted, and one warning line each for logged requests replayed with a sampling they were
    not served with (what the spec alone shows, raw text to a chat model, is ``SweepSpec.warnings``).

    Raises:
        orchestrator.bench.datasets.DatasetError: the dataset cannot be read.
    """
    bench = spec.benchmark
    log = load_request_log(bench.dataset_path) if bench.dataset == "request_log" and bench.dataset_path else None
    prompts = (sample_requests(log, count=bench.num_prompts, seed=bench.seed) if log is not None else
               load_dataset(dataset=bench.dataset, count=bench.num_prompts, seed=bench.seed,
                            dataset_path=bench.dataset_path, random_input_len=bench.random_input_len))
    traffic = fingerprint(source=bench.dataset, prompts=prompts, selected=bench.num_prompts, seed=bench.seed,
                          api=bench.api, output_len=bench.output_len, temperature=bench.temperature,
                          ignore_eos=bench.ignore_eos, chat_template_kwargs=bench.chat_template_kwargs,
                          path=bench.dataset_path, log=log)
    return traffic, _unsampled_lines(spec, prompts) if log is not None else []


def _unsampled_lines(spec: SweepSpec, prompts: list[Prompt]) -> list[str]:
    """The warning for logged requests that carry no temperature (none when every one does)."""
    bench = spec.benchmark
    unsampled = sum(p.temperature is None for p in prompts)
    if not unsampled:
        return []
    return [f"benchmark.dataset_path: {unsampled} of the {bench.num_prompts} requests sent carry no temperature and "
            f"are replayed at benchmark.temperature {bench.temperature:g}" + (" (greedy)" if bench.temperature == 0 else "")
            + "; production served them at the server's default (1.0 for SGLang's OpenAI API), and acceptance under "
            "sampling is lower than under greedy decoding: set their temperature in the log, or benchmark.temperature "
            "to what you serve"]
