"""Fixtures: a real server per test session (per xdist worker), a clean DB per test.

``REDIS_URL`` points the whole suite at an existing server instead (its
database is flushed before every test: use a scratch database).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from ._server import RedisServer


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"  # redis.asyncio runs on asyncio only


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway server for the whole session (one per xdist worker)."""
    if explicit := os.environ.get("REDIS_URL"):
        yield explicit
        return
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A client on a freshly flushed database."""
    client = redis.asyncio.Redis.from_url(redis_url)
    await client.flushdb()
    try:
        yield client
    finally:
        await client.aclose()
