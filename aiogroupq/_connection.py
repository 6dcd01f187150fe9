"""Own or borrow a ``redis.asyncio.Redis`` client."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Final, ParamSpec, TypeVar

import anyio
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from .errors import ConfigurationError, RedisUnavailableError

logger = logging.getLogger("aiogroupq")

P = ParamSpec("P")
T = TypeVar("T")

RedisLike = str | Redis
"""A ``redis://`` URL (we create and close the client) or a client to borrow."""

#: socket timeout of clients we create: above the longest BLPOP we issue
OWN_SOCKET_TIMEOUT: Final = 10.0
#: connect timeout of clients we create
OWN_CONNECT_TIMEOUT: Final = 2.0
#: re-sends of an idempotent command after a connection error, with a random
#: backoff of at most 50 ms doubling to 1 s: at most about 2.5 s of waiting in
#: all, plus up to the connect timeout per attempt while the host is silent
OWN_RETRIES: Final = 6


def check_borrowed(client: Redis) -> None:
    """Refuse a client whose replies would be ``str``: envelopes are binary."""
    if client.connection_pool.connection_kwargs.get("decode_responses", False):
        raise ConfigurationError(
            "the Redis client was created with decode_responses=True; aiogroupq "
            "stores MessagePack and needs bytes: pass a client made with "
            "decode_responses=False (the default) or a URL"
        )


def socket_timeout(client: Redis) -> float | None:
    """The client's socket timeout in seconds (``None``: unlimited)."""
    value = client.connection_pool.connection_kwargs.get("socket_timeout")
    return None if value is None else float(value)


def require_asyncio() -> None:
    """Refuse to start outside asyncio: redis.asyncio runs on nothing else, and
    under trio it would fail only at the first command, with a ``TypeError``.

    :raises ConfigurationError: if no asyncio event loop runs in this thread
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            "aiogroupq runs on asyncio; no asyncio event loop is running here "
            "(trio or another event loop?), and redis.asyncio supports no other: "
            "start it with asyncio.run() or anyio.run(..., backend='asyncio')"
        ) from None


@asynccontextmanager
async def open_client(redis: RedisLike, *, retry: bool) -> AsyncIterator[Redis]:
    """Yield a usable client; close it afterwards only if we created it.

    :param retry: keep redis-py's automatic re-sending of commands after a
        connection error. Only for idempotent callers (enqueue, status); the
        consumer retries at its own layer, where it knows what is safe.
    :raises ConfigurationError: outside asyncio, or for an unusable client
    """
    require_asyncio()
    if isinstance(redis, Redis):
        check_borrowed(redis)
        yield redis
        return
    if not isinstance(redis, str):
        raise ConfigurationError(
            f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
        )
    kwargs: dict[str, object] = {
        "socket_timeout": OWN_SOCKET_TIMEOUT,
        "socket_connect_timeout": OWN_CONNECT_TIMEOUT,
        "retry": Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), OWN_RETRIES)
        if retry
        else Retry(NoBackoff(), 0),
    }
    try:
        client = Redis.from_url(redis, **kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigurationError(f"unusable Redis URL {redis!r}: {exc}") from exc
    try:
        yield client
    finally:
        # Also when we are being cancelled: else the connection leaks.
        with anyio.CancelScope(shield=True):
            await client.aclose()


def unavailable_as_error(
    method: Callable[P, Awaitable[T]],
) -> Callable[P, Awaitable[T]]:
    """Turn a connection failure that outlived the client's retries into
    :class:`~aiogroupq.RedisUnavailableError`."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (ConnectionError, TimeoutError) as exc:
            raise RedisUnavailableError(str(exc) or type(exc).__name__) from exc

    return wrapper


async def check_server(client: Redis) -> None:
    """Refuse servers too old for our scripts; warn about an eviction policy
    that would silently drop queue keys.

    :raises ConfigurationError: for Redis < 7.0 (Valkey reports 7.2 or later)
    """
    info: Any = await client.info("server")
    version = str(info.get("redis_version", "0"))
    if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) < (7, 0):
        raise ConfigurationError(
            f"aiogroupq needs Redis >= 7.0 or Valkey >= 7.2 (script flags); "
            f"this server is {version}"
        )
    try:
        policy: Any = await client.config_get("maxmemory-policy")
    except ResponseError:  # CONFIG is often disabled on managed services
        logger.warning(
            "could not read maxmemory-policy; make sure it is 'noeviction', or "
            "Redis may evict queued tasks under memory pressure"
        )
        return
    value = policy.get("maxmemory-policy", policy.get(b"maxmemory-policy", b""))
    value = value.decode() if isinstance(value, bytes) else str(value)
    if value and value != "noeviction":
        logger.warning(
            "Redis maxmemory-policy is %r: under memory pressure it may evict "
            "queued tasks. Set it to 'noeviction'",
            value,
        )
