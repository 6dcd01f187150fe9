"""What a :class:`~aiogroupq.Producer` and an :class:`~aiogroupq.Admin`
share: the queue's partitions, with the layout learnt on entering, and the
client they open."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ..errors import ConfigurationError
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
        self._client: Client | None = None

    @property
    def queue(self) -> str:
        """The queue's name."""
        return self._keys.queue

    @unavailable_as_error
    async def _open_layout(self, client: Client) -> None:
        await open_layout(client, self._parts, self._requested)

    def _open_client(self) -> Client:
        if self._client is None:
            name = type(self).__name__
            raise RuntimeError(
                f"this {name} is not open: use it inside 'async with {name}(...)'"
            )
        return self._client
