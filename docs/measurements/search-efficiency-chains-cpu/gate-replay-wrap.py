"""Run benchmarks/search_efficiency.py (of the cwd checkout) and add per-seed search trials, visits, pick."""
import json, statistics, sys
sys.path.insert(0, "benchmarks"); sys.path.insert(0, ".")
import search_efficiency as se
picks = []
orig = se.final_pick
def final_pick(grid, trials, **kw):
    p = orig(grid, trials, **kw)
    picks.append({"trials": p.trials, "visits": p.visits, "pick": p.key, "pick_value": grid.values.get(p.key),
                  "within": p.within_target, "verdict": p.verdict})
    return p
se.final_pick = final_pick
orig_run = se.run_benchmark
def run_benchmark(grid, **kw):
    out = orig_run(grid, **kw)
    n = kw["seeds"]
    for i, name in enumerate(out["searchers"]):
        mine = picks[i * n:(i + 1) * n]
        out["searchers"][name]["median_search_trials"] = statistics.median(p["trials"] for p in mine)
        out["searchers"][name]["mean_search_trials"] = round(statistics.mean(p["trials"] for p in mine), 2)
        out["searchers"][name]["picks"] = mine
    out["best_value"] = grid.best_value()
    return out
se.run_benchmark = run_benchmark
sys.exit(se.main(sys.argv[1:]))
