"""What an engine start spent its time on, read from the engine's own log.

SGLang 0.5.23 logs, per TP rank (``[... TPn]`` prefixes):

* ``Load weight end. elapsed=X s, ...`` (``model_runner.py``; with deferred weights
  ``startup_weight_load.py``'s ``Load weight end. Committed real weights ... in X s``);
* ``Memory pool end. avail mem=...`` (``kv_cache_configurator.py``);
* ``Capture <role> decode cuda graph end. bs=..., elapsed=X s, ...`` and ``Capture <role> prefill
  CUDA graph end. elapsed=X s, ...`` (``cuda_graph_setup.py``), one per captured runner;

and ``The server is fired up and ready to roll!`` once (``http_server.py``). The reference engine
logs the same lines. Under speculation the draft is a second model runner in each rank's process
(``speculative/eagle_worker_v2.py`` l.223-227): it logs its own ``Load weight end`` after the
target's, with the same prefix (only ``type=`` tells them apart). A start's phases are the slowest
rank's weights (the sum of its loads, draft included) and its CUDA graphs (the sum of its captures),
and the rest of the launch-to-healthy time (process start, distributed init, the
memory pool, warm-up): what a cold start spends longer on, and what sweep-only start flags save.
Standard library only.
"""

from __future__ import annotations

import re
from collections import defaultdict

from serving.engine.log_lines import rank_lines

__all__ = ["start_phases"]

_WEIGHTS = re.compile(r"Load weight end\. (?:.*?elapsed=|Committed real weights.*? in )([0-9.]+) s")
_GRAPH = re.compile(r"Capture .*?(?:cuda|CUDA) graph end\. .*?elapsed=([0-9.]+) s")


def start_phases(log_text: str, *, total_s: float | None) -> dict[str, float]:
    """``{"weights", "cuda_graphs", "other"}`` seconds of one start (``other`` only with ``total_s``,
    the launch-to-healthy time); ``{}`` where the log has no weight line (an engine that logs
    otherwise, or a start that never loaded)."""
    weights: dict[int | None, float] = defaultdict(float)
    graphs: dict[int | None, float] = defaultdict(float)
    for rank, line in rank_lines(log_text):
        if (found := _WEIGHTS.search(line)) is not None:
            weights[rank] += float(found.group(1))  # the target's, then the draft's
        elif (found := _GRAPH.search(line)) is not None:
            graphs[rank] += float(found.group(1))
    if not weights:
        return {}
    phases = {"weights": round(max(weights.values()), 3), "cuda_graphs": round(max(graphs.values(), default=0.0), 3)}
    if total_s is not None:
        phases["other"] = round(max(0.0, total_s - phases["weights"] - phases["cuda_graphs"]), 3)
    return phases
