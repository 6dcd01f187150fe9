"""Fixtures: a real server per test session (per xdist worker), a clean DB per
test, and ``spawn`` for the command-line tests.

They come from aiogroupq's own pytest plugin (``aiogroupq.testing.pytest_plugin``,
the one users opt into); ``redis_url`` and ``redis_client`` are this suite's
short names for them. ``REDIS_URL`` points the whole suite at an existing
server instead (its database is flushed before every test: use a scratch
database).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio

from ._spawn import Proc, Spawn

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


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(*args)`` starts ``python -m aiogroupq *args`` (a :class:`Proc`,
    its output in the test's directory); killed after the test if still
    running."""
    made: list[Proc] = []

    def start(*args: str) -> Proc:
        made.append(Proc(args, tmp_path / f"proc{len(made)}.log"))
        return made[-1]

    yield start
    for proc in made:  # a failed test leaves no process behind
        proc.kill()
