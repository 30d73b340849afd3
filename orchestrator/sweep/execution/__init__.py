"""The sweep on Ray: the driver's story, its hold on the cluster, the writer actor, and the work
that runs on the cluster.

* ``driver``: ``run_sweep``, one sweep top to bottom (preflight, Tune, confirmation, finish).
* ``sweep_preflight``: what a sweep needs, checked before its first trial.
* ``ray_connection``: connecting to Ray, and starting or finding the writer actor.
* ``coordinator``: the writer (a Ray actor): MLflow runs, ``trials.jsonl``, the correctness baseline.
* ``callbacks``: Ray Tune's callbacks on the driver: progress lines, each result's record to the writer.
* ``trial``, ``session``, ``start_flags``: one trial as a Tune trainable; one engine's life; the
  flags that start it sooner.
* ``visit``, ``visit_worker``: the confirmation's visits on fresh engines, placed like a trial.
* ``finish``: the end: every trial recorded, the summary, ``best.yaml`` and the plots written and logged.
* ``preview``: ``dry_run``, the first proposals and their engine commands, without Ray.
* ``before_bed``: what a spec's files and sizes let be checked before the night (validate, the dry run).
"""
