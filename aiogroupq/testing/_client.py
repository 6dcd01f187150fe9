"""The client that the pytest plugin's ``aiogroupq_redis`` hands to a test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio

from .._store.sentinel import is_sentinel_url, master_from_url


@asynccontextmanager
async def flushed_client(url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """A client of *url* on a freshly flushed database, closed on leaving;
    made and closed on the running loop, which its connections belong to."""
    client = (
        master_from_url(url, {})
        if is_sentinel_url(url)
        else redis.asyncio.Redis.from_url(url)
    )
    try:
        await client.flushdb()
        yield client
    finally:
        await client.aclose()
