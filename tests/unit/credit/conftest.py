"""Fixtures shared by the credit unit tests."""

from __future__ import annotations

import pytest

import critics


@pytest.fixture
def registered():
    """``add(name, fn, **kw)`` registers an advantage estimator for this test only."""
    names = []

    def add(name, fn, **kw):
        critics.register_estimator(name, fn, **kw)
        names.append(name)
        return fn

    yield add
    for n in names:
        critics.ESTIMATORS.pop(n, None)
