"""Fixtures shared by the unit tests (their doubles live in edge_doubles.py and workspace_doubles.py)."""

import pytest
from workspace_doubles import MemoryStorage

from durable.store import Store


@pytest.fixture
def store():
    """A workspace's SQL store over in-memory SQLite."""
    return Store(MemoryStorage())
