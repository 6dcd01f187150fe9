"""What aiogroupq asks of the servers it talks to, checked on entering a
producer, a consumer or an admin: Redis >= 7.0 (or Valkey >= 7.2), the
``noeviction`` policy, a cluster client (not a plain one) for a Redis
Cluster, and for ``durability="replicated"`` a replica per primary.

The consumer's own client neither bounds nor re-sends its calls, so each
round trip of these checks is bounded here, by the same budget as a
producer's call (``CALL_BUDGET``).
"""

from __future__ import annotations

__all__ = ("check_replicas", "check_server")

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from ..errors import ConfigurationError, RedisUnavailableError
from . import failures as _failures
from .connection import CALL_BUDGET, Client, address_of, connection_kwargs
from .failures import NOT_A_CLUSTER_CLIENT, NOT_TRANSIENT

logger = logging.getLogger("aiogroupq")

T = TypeVar("T")


async def check_server(client: Client, *, eviction: bool = True) -> None:
    """Refuse servers too old for our scripts, or that may evict our keys,
    and a plain client of a cluster node.

    Needs no privileged command: the version comes from ``HELLO`` (``INFO``
    as a fallback), and a denied ``CONFIG GET`` only logs a warning. One
    round trip (two if ``HELLO`` is refused), each within
    :data:`CALL_BUDGET`; with a cluster, one per primary, at once.

    :param eviction: check ``maxmemory-policy`` (False: the user accepted
        eviction, ``allow_eviction=True``)
    :raises ConfigurationError: for Redis < 7.0 (Valkey reports 7.2 or
        later), an eviction policy other than ``noeviction``, or a plain
        client (or ``redis://`` URL) of a Redis Cluster node
    :raises RedisUnavailableError: if the server does not answer in time
    """
    with _failures.translated_errors():
        if isinstance(client, RedisCluster):
            await _bounded(client, client.initialize)
            for node in client.get_primaries():
                # One after another: the first refusal is raised as it is
                # (not in an ExceptionGroup), and primaries are few.
                await _check_node(client, node, eviction)
            return
        # One pipeline: starting a consumer must not cost a round trip per
        # check (a consumer replacing a stalled one recovers its tasks sooner).
        # The PING comes first so that a refused password or database
        # reads as such, not as the refusal of a later command.
        ping, hello, *policy = await _bounded(
            client, functools.partial(_probe, client, eviction=eviction)
        )
        if isinstance(ping, Exception):
            raise ping
        if _hello_field(hello, "mode") == "cluster":
            raise ConfigurationError(NOT_A_CLUSTER_CLIENT)
        version = _version_of(hello)
        if version is None:
            version = await _info_version(client)
        _check_version(version, where="")
        if policy:
            _check_eviction(client, policy[0])


async def _check_node(client: RedisCluster, node: ClusterNode, eviction: bool) -> None:
    async def run(*args: Any) -> Any:
        try:
            return await _bounded(
                client,
                functools.partial(client.execute_command, *args, target_nodes=node),
            )
        except rexc.ResponseError as exc:
            return exc

    if isinstance(ping := await run("PING"), Exception):
        raise ping
    hello = await run("HELLO")
    version = None if isinstance(hello, Exception) else _version_of(hello)
    if version is None:
        info = await run("INFO", "server")
        if not isinstance(info, Exception):
            version = _version(info.get("redis_version", "0"))
    _check_version(version, where=f" (node {node.name})")
    if eviction:
        _check_eviction(client, await run("CONFIG", "GET", "maxmemory-policy"))


def _check_version(version: tuple[int, int] | None, *, where: str) -> None:
    if version is not None and version < (7, 0):
        raise ConfigurationError(
            f"aiogroupq needs Redis >= 7.0 or Valkey >= 7.2 (script flags); "
            f"this server{where} is {'.'.join(map(str, version))}"
        )


async def _probe(client: Redis, *, eviction: bool) -> list[Any]:
    async with client.pipeline(transaction=False) as pipe:
        pipe.ping()
        # Without arguments HELLO switches nothing: it reports the server.
        hello: Any = pipe.execute_command
        hello("HELLO")
        if eviction:
            pipe.config_get("maxmemory-policy")
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies


async def _bounded(client: Client, call: Callable[[], Awaitable[T]]) -> T:
    # The consumer's own client neither bounds nor re-sends its calls (it
    # retries at its own layer), so its start-up checks are bounded here, and
    # tried again while connections are refused or dropped: a consumer
    # started during a Redis restart waits for it, as a producer's call does.
    wait = 0.05
    _failures.forget_failures()
    with anyio.move_on_after(CALL_BUDGET):
        while True:
            try:
                return await call()
            except (rexc.ConnectionError, rexc.TimeoutError) as exc:
                if isinstance(exc, NOT_TRANSIENT):
                    raise
                _failures.note_failure(exc)
            await anyio.sleep(wait)
            wait = min(wait * 2, 1.0)
    # A client's own BoundedRetry may have met the failures: it noted them.
    raise RedisUnavailableError(_failures.gave_up(address_of(client), CALL_BUDGET))


def _version(text: object) -> tuple[int, int] | None:
    raw = text.decode() if isinstance(text, bytes) else str(text)
    major, _, rest = raw.partition(".")
    minor = rest.partition(".")[0]
    if not major.isdigit():
        return None
    return int(major), int(minor) if minor.isdigit() else 0


def _hello_field(hello: Any, name: str) -> str | None:
    """A field of a HELLO reply (a flat list in RESP2, a map in RESP3)."""
    if isinstance(hello, list | tuple):
        hello = dict(zip(hello[::2], hello[1::2], strict=False))
    if isinstance(hello, dict):
        for key in (name, name.encode()):
            if key in hello:
                value = hello[key]
                return value.decode() if isinstance(value, bytes) else str(value)
    return None


def _version_of(hello: Any) -> tuple[int, int] | None:
    """The server's (major, minor) from a HELLO reply, None without one."""
    text = _hello_field(hello, "version")
    return None if text is None else _version(text)


async def _info_version(client: Redis) -> tuple[int, int] | None:
    """The server's (major, minor) from INFO (HELLO refused: Redis < 6, or
    an ACL without it); None if no command may tell it."""
    try:
        info: Any = await _bounded(client, functools.partial(client.info, "server"))
    except rexc.ResponseError:
        logger.warning(
            "could not read the server's version (HELLO and INFO refused); "
            "aiogroupq needs Redis >= 7.0 or Valkey >= 7.2"
        )
        return None
    return _version(info.get("redis_version", "0"))


def _check_eviction(client: Client, reply: Any) -> None:
    if isinstance(reply, rexc.ResponseError):
        # CONFIG is denied to least-privilege users and renamed or disabled on
        # managed services: say so (once per start), and trust the operator.
        logger.warning(
            "could not read maxmemory-policy of Redis at %s (%s); make sure it "
            "is 'noeviction', or Redis may evict queued tasks under memory "
            "pressure (allow_eviction=True skips this check)",
            _describe(client),
            reply,
        )
        return
    if isinstance(reply, Exception):
        raise reply
    if isinstance(reply, list | tuple):  # a cluster node's raw reply (redis-py 5)
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    value = reply.get("maxmemory-policy", reply.get(b"maxmemory-policy", b""))
    policy = value.decode() if isinstance(value, bytes) else str(value)
    if policy and policy != "noeviction":
        raise ConfigurationError(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis "
            "would evict queue keys (tasks, group locks, parked lists), losing "
            "acknowledged tasks and breaking group order. Set it to "
            "'noeviction' (CONFIG SET maxmemory-policy noeviction, and in "
            "redis.conf), or pass allow_eviction=True to accept the risk"
        )


def _describe(client: Client) -> str:
    """host:port/db (or the socket path) of *client*, without credentials."""
    if isinstance(client, RedisCluster):
        return "the Redis Cluster"
    return f"{address_of(client)}/{connection_kwargs(client).get('db', 0)}"


async def check_replicas(client: Client) -> None:
    """For ``durability="replicated"``: refuse a primary without any replica
    (every write would then be refused as not replicated). An ``INFO`` the
    user may not run only logs a warning.

    :raises ConfigurationError: for a primary with no replica connected
    """
    with _failures.translated_errors():
        if isinstance(client, RedisCluster):
            await _bounded(client, client.initialize)
            targets: list[ClusterNode | None] = list(client.get_primaries())
        else:
            targets = [None]
        for node in targets:
            try:
                if node is None:
                    info: Any = await _bounded(
                        client, functools.partial(client.info, "replication")
                    )
                else:
                    assert isinstance(client, RedisCluster)
                    info = await _bounded(
                        client,
                        functools.partial(
                            client.execute_command,
                            "INFO",
                            "replication",
                            target_nodes=node,
                        ),
                    )
            except rexc.ResponseError as exc:
                logger.warning(
                    "could not read how many replicas Redis has (%s); "
                    "durability='replicated' needs one per primary",
                    exc,
                )
                return
            if int(info.get("connected_slaves", 0)) < 1:
                where = _describe(client) if node is None else node.name
                raise ConfigurationError(
                    f"durability='replicated' needs a replica, and the primary "
                    f"at {where} has none connected: every write would be "
                    "refused as not replicated"
                )
