"""What the sweep tries next and what it stops: ``searcher`` (the Optuna searcher behind Ray
Tune's Searcher interface, baselines first) and ``early_stopping`` (ASHA that spares the baselines)."""
