"""Re-exports ``app_builder`` for Serve config files with ``import_path: serving.app:app_builder``.

The application lives in ``serving.serve.app``; import from there.
"""

from serving.serve.app import app_builder

__all__ = ["app_builder"]
