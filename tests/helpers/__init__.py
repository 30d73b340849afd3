"""What the tests share that is not a fixture: engine configs, test doubles, clusters, specs.

``tests/`` is on ``sys.path`` (``pythonpath`` in pyproject.toml's pytest settings), so a test
imports these as ``from helpers.engine import reference_config``. Fixtures stay in the
``conftest.py`` files, and a test module never imports another test module.

    bench.py             FakeServer (an SGLang/OpenAI test double), running_engine, logged
    engine.py            the reference-engine config, the bounded wait, environ, marked processes
    ray_cluster.py       RayCluster: a real `ray start` cluster (own temp dir and ports), stopped exactly
    reference_core.py    the decoding core in-process (TP=2 as two threads): models, prompts, run_tp
    reference_server.py  reference engines as processes or in this process; http, SSE, metrics
    serve.py             ServeProcess: `spectune serve` as a user runs it; its config, HTTP, markers
    spec_cases.py        BASE (a valid sweep spec), with_ (one field changed), BROKEN (refused specs)
    sweep.py             BASE_SPEC and write_spec for small reference sweeps, engine markers, MLflow checks
"""
