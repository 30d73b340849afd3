"""Every figure the README states is tied to the file it comes from (issue 58).

Each entry of ``FIGURES`` builds a figure's words, as the README writes them, from its source today:
the Kimi specs' night plan (``planned_starts`` / ``night_plan``, what their dry runs print),
the search-efficiency replays (``benchmarks/data/results/*.json``), the measurement files the README
quotes, the specs, ``pyproject.toml`` and the code's constants. A figure whose source moved fails
``test_each_figure_matches_its_source``; a number in the README's prose that no entry covers fails
``test_every_number_in_the_readme_has_a_source``: give it a source here, or take it out of the README.
Code (fenced blocks, backtick spans) is not prose; the fenced blocks that quote a run's output are
checked line by line against the file they name (``QUOTED_BLOCKS``).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
FLAT = " ".join(README.split())
RESULTS = REPO / "benchmarks" / "data" / "results"
CHAINS = REPO / "docs" / "measurements" / "search-efficiency-chains-cpu"
KIMI = sorted((REPO / "experiments").glob("kimi-k2.5-*.yaml"))


def _text(rel: str) -> str:
    return (REPO / rel).read_text()


def _stated(rel: str, *phrases: str) -> bool:
    """Every phrase is written in the file ``rel`` (a measurement's own README or output)."""
    text = " ".join(_text(rel).split())
    return all(phrase in text for phrase in phrases)


def _g(value: float) -> str:
    """``0.9``, ``0.15``, ``39.5``, ``49``: how the README and the result tables write a number."""
    return f"{value:g}"


def _pct(fraction: float) -> str:
    """``0.05`` -> ``5%``, ``0.0492`` -> ``4.9%``, ``0.4256`` -> ``42.6%``."""
    return f"{round(fraction * 100, 1):g}%"


def _hours(seconds: float) -> str:
    """Hours into the night as the dry run writes them: ``2h31m``."""
    minutes = int(round(seconds / 60))
    return f"{minutes // 60}h{minutes % 60:02d}m"


# --- the replays -----------------------------------------------------------------------------------

def _replay(name: str, folder: Path = RESULTS) -> dict[str, Any]:
    return json.loads((folder / f"{name}.json").read_text())


def _rate(name: str, who: str = "spectune", folder: Path = RESULTS) -> str:
    return _g(_replay(name, folder)["searchers"][who]["final_within_target_rate"])


def _launches(name: str, who: str = "spectune", folder: Path = RESULTS) -> str:
    return _g(_replay(name, folder)["searchers"][who]["median_launches"])


def _one(values: set[str]) -> str:
    assert len(values) == 1, f"the sources disagree: {sorted(values)}"
    return values.pop()


def _replays_phrase() -> str:
    h200 = _replay("search-efficiency-h200-listed-composed-ngrid")
    quiet = _replay("search-efficiency-reference-cpu-grid-quiet-ngrid")
    quiet_nccl = _replay("search-efficiency-reference-cpu-grid-quiet-simulated-nccl-ngrid")
    seeds = _one({str(d["seeds"]) for d in (h200, quiet, quiet_nccl)})
    conf = _one({json.dumps({k: d["confirmation"][k] for k in ("top_k", "min_visits", "max_visits", "margin")})
                 for d in (h200, quiet, quiet_nccl)})
    conf = json.loads(conf)
    return (f"Replayed on measured grids ({seeds} seeds each; `SEEDS={seeds} benchmarks/search_efficiency_all.sh`; "
            f"the table, and how each grid was made, in [docs/search-efficiency.md](docs/search-efficiency.md)): "
            f"replays of a CPU engine's grids and of one composed from a GPU sweep, not nights on GPUs. With the "
            f"default confirmation (top {conf['top_k']}, {conf['min_visits']}-{conf['max_visits']} visits, margin "
            f"{_pct(conf['margin'])}) the pick a sweep ends on is within 2% of the grid's best in "
            f"{_rate('search-efficiency-h200-listed-composed-ngrid')} of the seeds on the H200-shaped grid "
            f"({h200['grid_size']} points, {_pct(h200['noise_cv'])} noise; random search "
            f"{_rate('search-efficiency-h200-listed-composed-ngrid', 'random')}), in "
            f"{_rate('search-efficiency-reference-cpu-grid-quiet-ngrid')} on the CPU grid measured on a quiet machine "
            f"(`{quiet['grid']}`: {quiet['grid_size']} points, its own {_pct(quiet['noise_cv'])} noise; random "
            f"{_rate('search-efficiency-reference-cpu-grid-quiet-ngrid', 'random')}) and in "
            f"{_rate('search-efficiency-reference-cpu-grid-quiet-simulated-nccl-ngrid')} on it with simulated NCCL "
            f"presets ({quiet_nccl['grid_size']} points; random "
            f"{_rate('search-efficiency-reference-cpu-grid-quiet-simulated-nccl-ngrid', 'random')}), in "
            f"{_launches('search-efficiency-h200-listed-composed-ngrid')}, "
            f"{_launches('search-efficiency-reference-cpu-grid-quiet-ngrid')} and "
            f"{_launches('search-efficiency-reference-cpu-grid-quiet-simulated-nccl-ngrid')} engine launches.")


def _not_ahead_phrase() -> str:
    single = _replay("search-efficiency-reference-cpu-grid-single-ngrid")
    single_nccl = "search-efficiency-reference-cpu-grid-single-simulated-nccl-ngrid"
    three = _replay("search-efficiency-reference-cpu-grid-ngrid")
    three_nccl = "search-efficiency-reference-cpu-grid-simulated-nccl-ngrid"
    fixed = [f"search-efficiency-reference-cpu-grid-n{noise}" for noise in ("0", "0.03", "0.05")]
    fixed_rate = _one({_rate(name) for name in fixed})
    fixed_random = _one({_rate(name, "random") for name in fixed})
    fixed_noise = sorted(_replay(name)["noise_cv"] for name in fixed)
    return (f"It is not ahead everywhere: on the grid of one earlier sweep with shorter repetitions "
            f"({_pct(single['noise_cv'])} noise) {_rate('search-efficiency-reference-cpu-grid-single-ngrid')} and "
            f"{_rate(single_nccl)} (random {_rate('search-efficiency-reference-cpu-grid-single-ngrid', 'random')} and "
            f"{_rate(single_nccl, 'random')}); on the grid from three sweeps on a loaded machine (`{three['grid']}`, "
            f"{three['grid_size']} points) {fixed_rate} at {_pct(fixed_noise[0]).rstrip('%')}-{_pct(fixed_noise[-1])} "
            f"noise, where random search gets {fixed_random}, and {_rate('search-efficiency-reference-cpu-grid-ngrid')} "
            f"and {_rate(three_nccl)} at its own {_pct(three['noise_cv'])} (random "
            f"{_rate('search-efficiency-reference-cpu-grid-ngrid', 'random')} and {_rate(three_nccl, 'random')}).")


def _chains_replay_phrase() -> str:
    night = [_replay(name, CHAINS) for name in ("gate-after-chains-b11", "gate-after-simnccl-b20")]
    today = [_replay(name, CHAINS) for name in ("chains-current-b11", "simnccl-current-b40")]
    conf = json.loads(_one({json.dumps({k: d["confirmation"][k] for k in ("top_k", "min_visits", "max_visits", "margin")})
                            for d in night}))
    seeds = _one({str(d["seeds"]) for d in night})
    within = _one({str(round(d["searchers"]["spectune"]["final_within_target_rate"] * d["seeds"])) for d in night})
    starts = [_g(d["searchers"]["spectune"]["median_launches"]) for d in night]
    return (f"With the night-sized confirmation the Kimi specs ship (top {conf['top_k']}, {conf['min_visits']}-"
            f"{conf['max_visits']} visits, margin {_pct(conf['margin'])}), the chain grids' replays pick within 2% of the "
            f"best in {within} of {seeds} seeds in a median {starts[0]} and {starts[1]} engine starts (search budgets "
            f"{night[0]['budget']} and {night[1]['budget']}), where the default confirmation after budgets of "
            f"{today[0]['budget']} and {today[1]['budget']} takes {_g(today[0]['searchers']['spectune']['median_launches'])} "
            f"and {_g(today[1]['searchers']['spectune']['median_launches'])}")


def _kimi_conf_matches_night_replay() -> bool:
    """The replay's "night-sized confirmation" is the one the Kimi specs ship."""
    night = _replay("gate-after-chains-b11", CHAINS)["confirmation"]
    specs = [yaml.safe_load(path.read_text())["confirmation"] for path in KIMI]
    return all(c["top_k"] == night["top_k"] and c["max_visits"] == night["max_visits"] and c["margin"] == night["margin"]
               and c["no_speculation"] == night["no_speculation"] for c in specs)


# --- the night -------------------------------------------------------------------------------------

@functools.cache
def _nights() -> dict[str, Any]:
    """Per Kimi spec: its planned starts and night plan, as ``spectune sweep --dry-run`` prints them."""
    from orchestrator.spec import SweepSpec
    from orchestrator.sweep.output.cost import planned_starts
    from orchestrator.sweep.output.night_plan import night_plan

    out = {}
    for path in KIMI:
        spec = SweepSpec.from_yaml(path)
        out[path.stem] = {"spec": spec, "starts": planned_starts(spec), "plan": night_plan(spec)}
    return out


def _night_phrase() -> str:
    nights = _nights()
    assert all(n["plan"].fits for n in nights.values()), "a shipped Kimi night does not fit its time limit"
    trials = _one({str(n["starts"].trials) for n in nights.values()})
    total = _one({str(n["starts"].total) for n in nights.values()})
    visits = _one({str(n["starts"].visits) for n in nights.values()})
    limit = _one({_g(n["plan"].limit_s / 3600) for n in nights.values()})
    last = max(n["plan"].settings_first[-1][2] for n in nights.values() if n["plan"].settings_first)
    return (f"each plans {trials} trials, {total} engine starts with the confirmation's {visits} visits at most, "
            f"that fit {limit} h; every arm and NCCL setting is started by {_hours(last)}")


def _h200_phrase() -> str:
    night = _nights()["kimi-k2.5-eagle3-8x-h200"]
    arms = len(night["spec"].arms_on_node().measured)
    return f"H200: {_words(arms)} arms"


def _rtx_phrase() -> str:
    night = _nights()["kimi-k2.5-eagle3-8x-rtx-pro-6000"]
    first = night["plan"].settings_first
    assert first[0][0].startswith("pcie_ipc"), first[0]
    presets = len(night["spec"].search.nccl_presets or ())
    return (f"RTX PRO 6000: PCIe-IPC all-reduce first, at {_hours(first[0][2])}, {_words(presets)} NCCL presets by "
            f"{_hours(first[-1][2])}")


def _words(n: int) -> str:
    return ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"][n]


# --- the rest --------------------------------------------------------------------------------------

def _demo_phrase() -> str:
    spec = yaml.safe_load(_text("experiments/reference-cpu.yaml"))
    return (f"runs a real sweep of {spec['budget']['num_trials']} trials (the two baselines and "
            f"{_words(spec['budget']['num_trials'] - 2)} proposals) at concurrency {spec['objective']['concurrency']}")


def _demo_minutes_phrase() -> str:
    spec = yaml.safe_load(_text("experiments/reference-cpu.yaml"))
    return f"or the measured spread or the {_g(spec['confirmation']['max_minutes'])} minutes it may take"


def _confidence_phrase() -> str:
    from orchestrator.sequential import ALPHA

    return f"decided at {_g(round(100 * (1 - 2 * ALPHA), 6))}% over all looks"


def _exit_phrase() -> str:
    from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

    return f"Exit codes: {EXIT_OK} success, {EXIT_FAILED} the command ran and found a failure, {EXIT_BAD_INPUT} bad"


def _sweep_exit_phrase() -> str:
    from orchestrator.exit_codes import EXIT_BAD_INPUT, EXIT_OK
    from orchestrator.sweep.execution.finish import EXIT_NO_BEST

    return f"exit {EXIT_OK} with a valid best config, {EXIT_NO_BEST} without, {EXIT_BAD_INPUT} for a spec"


def _exit(name: str) -> Callable[[], str]:
    def phrase() -> str:
        import orchestrator.exit_codes as codes

        return f"exit {getattr(codes, name)}"
    return phrase


def _python_phrase() -> str:
    requires = re.search(r'^requires-python = "([^"]+)"', _text("pyproject.toml"), re.M).group(1)  # no tomllib on 3.10
    return f"Python {requires.replace('>=', '>= ')}"


def _probe_phrase() -> str:
    from orchestrator.spec_benchmark import DEFAULT_MAX_LOGPROB_GAP

    return f"near-tie flips within {_g(DEFAULT_MAX_LOGPROB_GAP)} nats"


def _progress_phrase() -> str:
    from serving.engine.node_checks import PROGRESS_EVERY_S

    return f"every {_g(PROGRESS_EVERY_S)} s"


def _interval_phrase() -> str:
    from orchestrator.statistics import MIN_VALUES

    return f"benchmark.repetitions: {MIN_VALUES - 1} gives no interval for a trial` | valid, but no interval can be " \
           f"stated from {MIN_VALUES - 1} values | raise `benchmark.repetitions` to {MIN_VALUES} or more"


def _graphs_phrase() -> str:
    data = json.loads(_text("docs/measurements/cuda-graphs-h200x1/eager-vs-graphs.json"))["graphs_over_eager_tok_s"]
    low, high = min(data.values()), max(data.values())
    assert _stated("docs/measurements/cuda-graphs-h200x1/README.md", "1.7% at c2")
    return f"decode CUDA graphs on a GPU ({low:.1f}-{high:.1f}x eager, 1.7% CV at c2 on an H200)"


def _quote(rel: str, phrase: str, *source_words: str) -> Callable[[], str]:
    """``phrase`` as the README writes it, tied to the words ``source_words`` in the file ``rel``."""
    def phrase_from_file() -> str:
        return phrase if _stated(rel, *(source_words or (phrase,))) else f"<{rel} no longer says {source_words}>"
    return phrase_from_file


CHAIN_README = "docs/measurements/chain-prediction-cpu/README.md"
H100_README = "docs/measurements/chain-prediction-h100x1/README.md"


def _sglang_phrase() -> str:
    from serving.sglang_flags import sglang_flags

    return f"SGLang pinned to {sglang_flags().version}"


def _gpu_node_phrase(prefix: str) -> Callable[[], str]:
    def phrase() -> str:
        gpus = _one({str(n["spec"].resources.gpus_per_trial) for name, n in _nights().items() if "2x8" not in name})
        return f"{prefix} {gpus}-GPU node"
    return phrase


def _chain_prediction_phrase() -> str:
    assert _stated(CHAIN_README, "**Runs 7 and 8 together**", "from the fewest starts (1 + 6) 16 of 16 covered at a "
                   "median half-width of 3.5% between starts", "accept length within 2.1% in all 16",
                   "opening (1 + 3 + 6) 12 of 12 at 4.5%")
    assert _stated(H100_README, "Over H100 runs 6-9", "1 + longest 8 of 8 covered at a median half-width of 6.9%")
    return ("On the CPU reference engine (runs 7-8, every round on fresh engines) 16 of 16 chains were covered at a "
            "median half-width of 3.5%, accept length within 2.1%; from the sweep's opening (SGLang's chain too) 12 of "
            "12 at 4.5%; on an H100 (runs 6-9) 8 of 8 at 6.9%.")


FIGURES: list[Callable[[], str]] = [
    _python_phrase,
    _demo_phrase,
    _confidence_phrase,
    _demo_minutes_phrase,
    _quote("docs/measurements/README.md", "From a fresh clone on a 2-core VM,\nexit 0 in 3 min 56 s with the install",
           "on this 2-core VM", "exit 0 in 3 min 56 s with the install (`demo.out`)"),
    _exit_phrase,
    _sweep_exit_phrase,
    _exit("EXIT_BAD_INPUT"),
    _exit("EXIT_FAILED"),
    lambda: _exit("EXIT_BAD_INPUT")().replace("exit", "exits"),
    _probe_phrase,
    _progress_phrase,
    _interval_phrase,
    _sglang_phrase,
    _gpu_node_phrase("one"),
    _gpu_node_phrase("On one"),
    _night_phrase,
    _h200_phrase,
    _rtx_phrase,
    _replays_phrase,
    _not_ahead_phrase,
    _chain_prediction_phrase,
    _chains_replay_phrase,
    _graphs_phrase,
    _quote("orchestrator/sweep/output/predicted_rows.py", "each with a 95% interval", "95% interval of what a start would"),
]
"""Each entry builds a figure's words from its source; the README must say exactly that."""

NAMES = ("RTX PRO 6000", "top-k 1")
"""Names with digits in them, not figures (a GPU; a chain is a top-k 1 configuration)."""

QUOTED_BLOCKS = {
    "docs/measurements/demo-cpu-issue43/demo.out": " #  configuration ",
    "docs/measurements/demo-cpu-5min/serve.txt": "serving ref-tiny at ",
}
"""A run's output the README quotes in a fenced block (the file, a line the block starts with)."""

NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:\.\d+)?")


def _prose(text: str) -> str:
    """The README without its fenced blocks, link targets and backtick spans."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return "\n".join(lines)


def _fenced(text: str) -> list[list[str]]:
    """The README's fenced blocks, each as its lines."""
    blocks: list[list[str]] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            if inside:
                blocks.append([])
        elif inside:
            blocks[-1].append(line)
    return blocks


@pytest.mark.parametrize("figure", FIGURES, ids=lambda f: getattr(f, "__name__", "figure"))
def test_each_figure_matches_its_source(figure: Callable[[], str]) -> None:
    phrase = " ".join(figure().split())
    assert phrase in FLAT, f"the README should say, from the source: {phrase!r}"


def test_the_kimi_specs_ship_the_replayed_night_confirmation() -> None:
    assert _kimi_conf_matches_night_replay()


def test_every_number_in_the_readme_has_a_source() -> None:
    text = README
    for phrase in sorted([*(f() for f in FIGURES), *NAMES], key=len, reverse=True):
        text = re.sub(r"\s+".join(map(re.escape, phrase.split())), " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", _prose(text))
    text = re.sub(r"`[^`\n]*`", " ", text)
    left = [line.strip() for line in text.splitlines() if NUMBER.search(line)]
    assert left == [], "numbers in the README with no source in tests/unit/test_readme_figures.py FIGURES"


@pytest.mark.parametrize("rel", sorted(QUOTED_BLOCKS))
def test_quoted_output_is_in_its_file(rel: str) -> None:
    block = next(b for b in _fenced(README) if b and b[0].startswith(QUOTED_BLOCKS[rel]))
    source = [line.rstrip() for line in _text(rel).splitlines()]  # a table's lines end in padding
    # a quoted line is the file's line, or its start where the README cuts it ("cut")
    missing = [line for line in block if not any(s.startswith(line.rstrip()) for s in source)]
    assert missing == [], f"lines the README quotes from {rel} that it does not hold"


def test_a_new_number_is_caught() -> None:
    """The sweep over the prose finds a figure nobody tied to a source."""
    assert NUMBER.findall(_prose("it takes 7 minutes\n```\n9 in code\n```")) == ["7"]


def test_the_sweep_pages_dry_run_excerpt_is_the_plan() -> None:
    """docs/sweep.md quotes the 8-GPU Kimi spec's dry run (cut where a line holds ``...``): each quoted line of the
    cost and the timeline is what ``cost_line`` / ``plan_lines`` print for that spec today."""
    from orchestrator.sweep.output.cost import cost_line
    from orchestrator.sweep.output.night_plan import plan_lines

    night = _nights()["kimi-k2.5-eagle3-8gpu"]
    printed = [cost_line(night["spec"], fits=night["plan"].fits), *plan_lines(night["plan"])]
    page = (REPO / "docs" / "sweep.md").read_text().splitlines()
    excerpt = next(b for b in _fenced("\n".join(page)) if b and b[0].startswith("cost: "))
    quoted = [line for line in excerpt if not line.startswith(("chance", "  at a between"))]
    flat = " ".join(" ".join(printed).split())
    missing = [line for line in quoted  # each part between the cuts, spaces aside
               if not all(" ".join(part.split()) in flat for part in re.split(r"\.\.\.;?\)*", line) if part.strip())]
    assert missing == [], "lines of docs/sweep.md's dry-run excerpt that the plan no longer prints"
