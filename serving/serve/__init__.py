"""Serving one engine configuration with Ray Serve (``spectune serve``).

The pieces, each with one job:

* ``options``       ``ServeOptions`` (replicas, autoscaling, host, port, ingress path...) and reading a
                    best-config file with its optional ``serve:`` block;
* ``openai_errors`` the OpenAI error body every refusal of the ingress uses;
* ``ingress``       the replica's ASGI app: OpenAI routes, API key, request checks, byte-for-byte
                    pass-through to the engine over one pooled HTTP client;
* ``replica``       the Serve deployment class: owns the engine's GPUs, runs the same
                    ``EngineProcess`` as the sweep, audits its env at start-up, health checks;
* ``cluster``       start a local Ray with the chosen ingress path (HAProxy or the plain proxy), or
                    join one and read which path it has;
* ``app``           the application: one deployment of ``replica`` with its resources and options,
                    and the Serve config file for ``serve deploy``;
* ``runner``        ``spectune serve`` in the foreground: deploy, readiness line, clean stop on Ctrl-C.

Each imports only those above it; ``app`` is imported by ``runner`` and by the CLI, never by the
pieces it assembles. (``serving.app`` only re-exports ``app_builder`` for Serve config files
written by earlier versions.)
"""
