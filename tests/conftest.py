"""Fixtures: a real server per test session (per xdist worker), a clean DB per test.

They come from aiogroupq's own pytest plugin (``aiogroupq.testing.pytest_plugin``,
the one users opt into); ``redis_url`` and ``redis_client`` are this suite's
short names for them. ``REDIS_URL`` points the whole suite at an existing
server instead (its database is flushed before every test: use a scratch
database).
"""

from __future__ import annotations

import pytest
import redis.asyncio

pytest_plugins = ["aiogroupq.testing.pytest_plugin"]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # redis.asyncio runs on asyncio only


@pytest.fixture(scope="session")
def redis_url(aiogroupq_redis_url: str) -> str:
    """A throwaway server for the whole session (one per xdist worker)."""
    return aiogroupq_redis_url


@pytest.fixture
def redis_client(aiogroupq_redis: redis.asyncio.Redis) -> redis.asyncio.Redis:
    """A client on a freshly flushed database."""
    return aiogroupq_redis
