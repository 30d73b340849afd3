"""spectune's reference engine: a small speculative-decoding LLM server with SGLang's interface.

Start it exactly like ``sglang.launch_server`` (``python -m serving.reference --model-path
ref-tiny --tp-size 2 --speculative-algorithm EAGLE3 ...``); it serves SGLang's endpoints and
metric names. See docs/reference-engine.md.

Module map (data flows top to bottom):

* ``cli`` / ``server_args``: flags (SGLang's names and rules) -> resolved ``ServerArgs``;
  ``checks``: the range checks flags and requests share.
* ``server``: lifecycle (bind, spawn, warm up, serve, shut down); ``faults``: fault switches;
  ``follower``: a node of rank >= 1 of an engine across ``--nnodes`` (its ranks, a health server).
* ``http_server``: the app factory; ``native_api`` (SGLang's routes) and ``openai_api`` (``/v1``)
  register on it; both stand on ``http_common`` (state, body reading, errors, streams);
  ``metrics``: Prometheus text.
* ``engine_client``: the HTTP process's link to the workers; ``protocol``: the messages.
* ``launcher``: spawning the TP worker processes; ``tp_worker``: one rank's main loop (each is
  handed the ``ServerArgs`` whole, in its ``WorkerConfig``).
* ``scheduler``: batching, prefill/decode/speculative iterations, counters.
* ``speculative``: draft tree and verification; ``sampling``: sampling parameters.
* ``model`` / ``kv_cache`` / ``parallel``: the sharded transformer, its cache, the TP group.
* ``config``: model presets; ``tokenizer``: byte tokenizer and chat template.

Only the standard library, torch and aiohttp are imported (numpy is optional).
"""
