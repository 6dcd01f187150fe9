"""Own or borrow a ``redis.asyncio.Redis`` client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import ConfigurationError

RedisLike = str | Redis
"""A ``redis://`` URL (we create and close the client) or a client to borrow."""

#: socket timeout of clients we create: above the longest BLPOP we issue
OWN_SOCKET_TIMEOUT: Final = 10.0


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


@asynccontextmanager
async def open_client(redis: RedisLike, *, retry: bool) -> AsyncIterator[Redis]:
    """Yield a usable client; close it afterwards only if we created it.

    :param retry: keep redis-py's automatic re-sending of commands after a
        connection error. Only for idempotent callers (enqueue, status); the
        consumer retries at its own layer, where it knows what is safe.
    """
    if isinstance(redis, Redis):
        check_borrowed(redis)
        yield redis
        return
    if not isinstance(redis, str):
        raise ConfigurationError(
            f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
        )
    kwargs: dict[str, object] = {"socket_timeout": OWN_SOCKET_TIMEOUT}
    if not retry:
        kwargs["retry"] = Retry(NoBackoff(), 0)
    try:
        client = Redis.from_url(redis, **kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ConfigurationError(f"unusable Redis URL {redis!r}: {exc}") from exc
    try:
        yield client
    finally:
        await client.aclose()
