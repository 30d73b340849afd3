"""Serving one engine configuration with Ray Serve (``spectune serve``).

``options`` (ServeOptions, best-config files), ``openai_errors``, ``ingress`` (the replica's ASGI
app), ``replica`` (the deployment class), ``cluster`` (start or join Ray), ``app`` (the application
and its Serve config file), ``runner`` (the foreground command). Each imports only those before it;
``app`` is imported by ``runner`` and the CLI, never by the pieces it assembles.
"""
