"""What a sweep writes and reads back: ``results`` (the :class:`TrialRecord` every part reads,
``trials.jsonl``, ``best.yaml``, the names of the results directory's files) and ``results_dir``
(where results go, an earlier sweep's moved to ``history/``)."""
