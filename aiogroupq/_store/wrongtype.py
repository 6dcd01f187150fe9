"""A key of the wrong type, as a reader that runs no script meets it.

A script refuses a damaged key itself (``corrupt()`` in ``_lua/lib/base.lua``,
turned into :class:`~aiogroupq.CorruptQueueError` by ``_store/replies.py``); a
plain command on it fails with a ``WRONGTYPE`` reply, which these helpers turn
into the same typed error, naming the key and what it holds, so that nobody
meets a raw ``redis.ResponseError``. The reply is known by its first word
only: its wording differs between Redis and Valkey versions, and redis-py
has no exception class of its own for it.
"""

from __future__ import annotations

__all__ = ("corrupt_key", "is_wrong_type")

from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from ..errors import CorruptQueueError

if TYPE_CHECKING:
    from .connection import Client


def is_wrong_type(exc: BaseException) -> bool:
    """Whether *exc* is a ``WRONGTYPE`` reply (a key holds another type than
    the command works on), also when a script's ``redis.call`` met it."""
    if not isinstance(exc, ResponseError):
        return False
    text = str(exc.args[0]) if exc.args else ""
    return text.split(" ", 1)[0] == "WRONGTYPE"


async def corrupt_key(
    client: Client, key: str, expected: str, what: str
) -> CorruptQueueError:
    """The error for *key*, which should be a *expected* (``"hash"``) and is
    not: it names the type found, and *what* the key holds for the queue.

    :param what: what a reader loses, e.g. "the queue's settings"
    """
    try:
        found: Any = await client.type(key)
    except RedisError:  # the error names the key; its type is a nicety
        found = b"another type"
    kind = found.decode(errors="replace") if isinstance(found, bytes) else str(found)
    return CorruptQueueError(key, f"it is a {kind}, not a {expected}: {what}")
