"""The "did you mean" every command adds when the queue it was given has
no keys (most often a misspelt name), from the names of the queues that
exist on the server (``_check.check.similar_queues``)."""

from __future__ import annotations

__all__ = ("did_you_mean",)

from typing import TYPE_CHECKING

from .._check.check import similar_queues
from ..errors import AiogroupqError

if TYPE_CHECKING:
    from .._store.connection import RedisLike


async def did_you_mean(redis: RedisLike, queue: str) -> str:
    """``; did you mean 'a' or 'b'?`` naming the existing queues closest to
    *queue*, or ``""`` when none is close.

    Only a hint: a server that refuses the search (a user without ``SCAN``)
    or stops answering meanwhile gives ``""``, and the command reports what
    it found without it.
    """
    try:
        near = await similar_queues(redis, queue)
    except AiogroupqError:
        return ""
    return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""
