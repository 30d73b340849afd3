"""Fixtures for the reference engine's in-process tests (helpers: tests/helpers/reference_core.py)."""

from __future__ import annotations

import pytest

from serving.reference.model import Model

from helpers.reference_core import make_models


@pytest.fixture(scope="session")
def tp1_models() -> list[Model]:
    """ref-tiny on one rank."""
    return make_models(1)


@pytest.fixture(scope="session")
def tp2_models() -> list[Model]:
    """ref-tiny split over two in-process ranks (threads)."""
    return make_models(2)
