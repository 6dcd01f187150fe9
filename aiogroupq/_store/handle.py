"""What a :class:`~aiogroupq.Producer` and an :class:`~aiogroupq.Admin`
share: the queue's partitions, with the layout learnt on entering, and the
client they open."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ..errors import ConfigurationError, NotOpenError
from .failures import unavailable_as_error
from .layout import open_layout
from .partition import Partitions, check_count

if TYPE_CHECKING:
    from .connection import Client, RedisLike


class QueueHandle:
    """A queue's name, partitions and open client (set while entered)."""

    def __init__(self, redis: RedisLike, queue: str, partitions: int | None) -> None:
        self._parts = Partitions(queue)
        self._keys = self._parts.keys(0)
        self._requested = (
            None if partitions is None else check_count("partitions", partitions)
        )
        if not isinstance(redis, str | Redis | RedisCluster):
            raise ConfigurationError(
                f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
            )
        self._redis = redis
        self._opened: Client | None = None
        self._opened_on: asyncio.AbstractEventLoop | None = None

    @property
    def queue(self) -> str:
        """The queue's name."""
        return self._keys.queue

    @unavailable_as_error
    async def _open_layout(self, client: Client) -> None:
        await open_layout(client, self._parts, self._requested)

    @property
    def _client(self) -> Client | None:
        """The client while entered (set on entering, ``None`` on leaving)."""
        return self._opened

    @_client.setter
    def _client(self, client: Client | None) -> None:
        # Set on the loop that enters: the client's connections are its own.
        self._opened_on = None if client is None else asyncio.get_running_loop()
        self._opened = client

    def _open_client(self) -> Client:
        """The open client, on the loop that opened it.

        :raises NotOpenError: outside ``async with``, or on another loop
        """
        # One C call and a compare per use: no cost that an enqueue shows.
        client = self._opened
        if client is None or self._opened_on is not asyncio.get_running_loop():
            raise NotOpenError(type(self).__name__, other_loop=client is not None)
        return client
