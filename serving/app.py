"""Kept so that Serve config files written by earlier versions (``import_path: serving.app:app_builder``) still deploy.

The application now lives in ``serving.serve.app``; import from there.
"""

from serving.serve.app import app_builder

__all__ = ["app_builder"]
