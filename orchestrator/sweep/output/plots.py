"""The sweep's plots, as PNG files the MLflow UI shows: Optuna's optimisation history, parameter
importance and parallel coordinates, throughput against TPOT p99 (Pareto), and throughput against
concurrency for the best configurations and both baselines.

The Optuna plots come from a study rebuilt from the records (not the live searcher), numbered as
the summary. A plot that cannot be drawn is skipped with a log line, never an error.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from orchestrator.sweep.records.results import TrialRecord

__all__ = ["IMPORTANCE_MIN_TRIALS", "draw_plots", "pareto_front", "varied_params"]

logger = logging.getLogger(__name__)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (x: higher is better, y: lower)."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (ox >= x and oy <= y) and (ox > x or oy < y) for j, (ox, oy) in enumerate(points) if j != i
        )
        if not dominated:
            front.append(i)
    return front


PLOTTED_STATUSES = ("ok", "infeasible")
"""Records the Optuna plots show as completed trials: measured with an objective value (an
infeasible one drawn grey, off the best-value line, as Optuna draws a violated constraint)."""


IMPORTANCE_MIN_TRIALS = 8
"""Completed trials below which the parameter-importance plot is not drawn: Optuna's fANOVA fits a
random forest to them, and from a handful of points its ranking is noise drawn as a finding."""


def _plotted(records: list[TrialRecord]) -> list[TrialRecord]:
    """The records the Optuna plots draw as completed trials (:data:`PLOTTED_STATUSES`, with a median)."""
    return [r for r in records if r.value is not None and r.status in PLOTTED_STATUSES]


def varied_params(records: list[TrialRecord]) -> dict[str, list[str]]:
    """Each parameter that took more than one value across the plotted trials, with its values (as
    text, sorted); ``env.*`` copies and parameters every measured trial held at one value are left
    out: a dimension the sweep never varied has no effect to plot or rank."""
    usable = _plotted(records)
    names = sorted({k for r in usable for k in r.params if not k.startswith("env.")})
    choices = {name: sorted({str(r.params.get(name)) for r in usable}) for name in names}
    return {name: values for name, values in choices.items() if len(values) > 1}


def _study(records: list[TrialRecord]) -> Any:
    """An Optuna study whose trial numbers are the sweep's: trial ``n`` of the summary is
    ``study.trials[n].number``. Every number up to the last gets a study trial: measured as
    COMPLETE (infeasible: with its SLO constraint), early-stopped as PRUNED, anything else (and 0)
    as FAIL; only COMPLETE ones are drawn, the others hold the numbering. Its parameters are the
    varied ones (:func:`varied_params`).
    """
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    direction = next((r.objective.direction for r in records if r.objective), "max")
    study = optuna.create_study(direction="maximize" if direction == "max" else "minimize")
    usable = _plotted(records)
    choices = varied_params(records)
    names = list(choices)
    measured = {r.number for r in usable}
    by_number = {r.number: r for r in records}
    for number in range(max(by_number, default=0) + 1):
        r = by_number.get(number)
        if r is None:
            study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs={"number": number}))
            continue
        attrs = {"label": r.label, "number": r.number, "status": r.status}
        if number in measured:
            study.add_trial(optuna.trial.create_trial(
                params={n: str(r.params.get(n)) for n in names},
                distributions={n: CategoricalDistribution(choices[n]) for n in names},
                value=r.value, user_attrs=attrs,
                constraints={"slo": r.slo_violation or 1.0} if r.status == "infeasible" else None,
            ))
        elif r.status == "early_stopped" and r.objective is not None and r.objective.values:
            study.add_trial(optuna.trial.create_trial(
                state=TrialState.PRUNED, user_attrs=attrs,
                intermediate_values={len(r.objective.values) - 1: r.objective.values[-1]},
            ))
        else:
            study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=attrs))
    return study


BEST_YAML_MARKER = dict(marker="*", s=320, facecolors="none", edgecolors="tab:green", linewidths=2, zorder=5)
"""How the history marks best.yaml's trial: a hollow green star around its point."""


def _history(study: Any, *, metric: str, best_trial: int | None = None) -> Any:
    """Optuna's optimisation history, with whole trial numbers on the x-axis and a label saying which
    are drawn; best.yaml's trial (``best_trial``), which need not be the search's best, is ringed and
    named in the title."""
    from matplotlib.ticker import MaxNLocator
    from optuna.visualization import matplotlib as ovm

    axes = ovm.plot_optimization_history(study, target_name=metric)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("trial, numbered as in the summary (early-stopped and failed trials are not drawn)")
    if best_trial is None:
        return axes
    axes.set_title(f"Optimization history (the search's values); best.yaml holds trial {best_trial}")
    trial = study.trials[best_trial] if 0 <= best_trial < len(study.trials) else None
    if trial is not None and trial.state.name == "COMPLETE":
        axes.scatter([best_trial], [trial.value], label=f"best.yaml: trial {best_trial}", **BEST_YAML_MARKER)
        axes.legend(bbox_to_anchor=(1.05, 1.0), loc="upper left")  # where Optuna puts its own
    return axes


def draw_plots(records: list[TrialRecord], *, out_dir: Path, metric: str, concurrency: int,
               best_trial: int | None = None) -> list[Path]:
    """Write the plots into ``out_dir``; returns the files made. A plot there is too little to draw
    from is skipped with a log line saying why.

    Args:
        best_trial: best.yaml's trial (``finish.best_yaml_choice``'s), marked on the optimisation
            history: the served configuration, where the search's best line may point elsewhere.
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    study = _study(records)

    def save(name: str, draw: Any) -> None:
        try:
            with warnings.catch_warnings():  # optuna marks its matplotlib plots experimental; matplotlib warns on flat axes
                warnings.simplefilter("ignore")
                axes = draw()
                figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
                figure.set_size_inches(10, 6)
                figure.tight_layout()
                path = out_dir / f"{name}.png"
                figure.savefig(path, dpi=110)
            made.append(path)
        except Exception as exc:  # noqa: BLE001 - a missing plot is not a failed sweep
            logger.info("plot %s skipped: %s", name, exc)
        finally:
            plt.close("all")

    completed = sum(1 for t in study.trials if t.state.name == "COMPLETE")
    varied = list(varied_params(records))
    if completed >= 1:
        save("optimization_history", lambda: _history(study, metric=metric, best_trial=best_trial))
    skip = _importance_skip(completed=completed, varied=varied)
    if skip:
        logger.info("plot param_importances skipped: %s", skip)
    else:
        save("param_importances", lambda: ovm.plot_param_importances(study, target_name=metric))
    if completed >= 2 and varied:
        save("parallel_coordinate", lambda: ovm.plot_parallel_coordinate(study, target_name=metric))
    elif completed >= 2:
        logger.info("plot parallel_coordinate skipped: no parameter took two values across the %d measured trials",
                    completed)
    save("pareto_throughput_tpot", lambda: _pareto(records, concurrency=concurrency))
    save("throughput_by_concurrency", lambda: _by_concurrency(records, metric=metric, concurrency=concurrency))
    return made


def _importance_skip(*, completed: int, varied: list[str]) -> str | None:
    """Why the parameter-importance plot is not drawn, or None: it needs two varied parameters to
    rank and :data:`IMPORTANCE_MIN_TRIALS` completed trials to rank them from."""
    if len(varied) < 2:
        which = f"only {varied[0]} varied" if varied else "no parameter varied"
        return f"{which} across the {completed} measured trial(s); a ranking needs two that did"
    if completed < IMPORTANCE_MIN_TRIALS:
        return (f"{completed} measured trial(s) of {', '.join(varied)}; a ranking from fewer than "
                f"{IMPORTANCE_MIN_TRIALS} is noise")
    return None


TOP_BY_CONCURRENCY = 3
"""Search trials drawn in the throughput-by-concurrency plot (the best at the objective's level)."""


def _by_concurrency(records: list[TrialRecord], *, metric: str, concurrency: int) -> Any:
    """Output tok/s (median per level) against concurrency for the best search trials at the
    objective's level and both baselines; where the objective is output tok/s, with each level's
    log-scale 95% interval of its repetitions (none from fewer than 3)."""
    import matplotlib.pyplot as plt

    from orchestrator.statistics import log_interval

    def levels_of(r: TrialRecord) -> list[int]:
        return sorted(int(k[1:].split(".", 1)[0]) for k in r.metrics if k.endswith(".output_tok_per_s"))

    complete = [r for r in records if r.status == "ok" and r.complete and r.value is not None and levels_of(r)]
    direction = next((r.objective.direction for r in complete if r.objective), "max")
    searched = sorted((r for r in complete if r.kind == "search"),
                      key=lambda r: -r.value if direction == "max" else r.value)[:TOP_BY_CONCURRENCY]  # type: ignore[operator]
    baselines = [r for r in records if r.kind in ("baseline_plain", "baseline_auto") and levels_of(r)]
    drawn = searched + baselines
    if not drawn:
        raise ValueError("no trial has output_tok_per_s at any concurrency level")
    fig, ax = plt.subplots()
    for r in drawn:
        xs = levels_of(r)
        ys = [r.metrics[f"c{c}.output_tok_per_s"] for c in xs]
        style = {"baseline_plain": dict(ls="--", c="black"), "baseline_auto": dict(ls=":", c="tab:gray")}.get(r.kind, {})
        line = ax.plot(xs, ys, marker="o", label=f"{r.number}: {r.label}", **style)[0]
        if metric == "output_tok_per_s":
            for x, y in zip(xs, ys):
                interval = log_interval(r.values_at(x))
                if interval is not None:
                    ax.errorbar([x], [y], yerr=[[max(0.0, y - interval[0])], [max(0.0, interval[1] - y)]],
                                c=line.get_color(), capsize=3, lw=1)
    ax.set_xscale("log", base=2)
    ticks = sorted({c for r in drawn for c in levels_of(r)})
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel("output tok/s (median of repetitions)")
    ax.set_title(f"Throughput by concurrency: the {TOP_BY_CONCURRENCY} best at concurrency {concurrency} and the "
                 "baselines (search estimates)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return ax


def _pareto(records: list[TrialRecord], *, concurrency: int) -> Any:
    import matplotlib.pyplot as plt

    x_key, y_key = f"c{concurrency}.output_tok_per_s", f"c{concurrency}.tpot_ms_p99"
    # an early-stopped trial's medians are of the one or two repetitions ASHA let it make: not a point to trade off
    usable = [r for r in records if x_key in r.metrics and y_key in r.metrics and r.status != "early_stopped"]
    if not usable:
        raise ValueError(f"no trial has both {x_key} and {y_key}")
    points = [(r.metrics[x_key], r.metrics[y_key]) for r in usable]
    front = set(pareto_front(points))
    fig, ax = plt.subplots()
    for i, (r, (x, y)) in enumerate(zip(usable, points)):
        on_front = i in front
        ax.scatter([x], [y], c="tab:red" if on_front else "tab:blue", s=60 if on_front else 30, zorder=3)
        ax.annotate(f"{r.number}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ordered = sorted((points[i] for i in front))
    ax.plot([p[0] for p in ordered], [p[1] for p in ordered], c="tab:red", lw=1, label="Pareto front")
    ax.set_xlabel(f"output tok/s at concurrency {concurrency} (higher is better)")
    ax.set_ylabel(f"TPOT p99 ms at concurrency {concurrency} (lower is better)")
    ax.set_title("Throughput vs TPOT p99 per trial (numbers: trial)")
    ax.legend()
    ax.grid(alpha=0.3)
    return ax
