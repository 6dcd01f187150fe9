"""The repair of a start counter (``starts``) stuffed with fields no claim
wrote: the check reports it (``stale-starts``); claims never sweep it whole
(``lib/starts.lua``), so its repair deletes the junk in slices."""

from __future__ import annotations

__all__ = ("clear_stale_starts",)

from typing import TYPE_CHECKING, Final

from .._limits import STARTS_WINDOW

if TYPE_CHECKING:
    from .._store.connection import Client

#: fields of the counter read (HSCAN ``COUNT``) and deleted per command, so
#: that no command holds the server long
_SLICE: Final = 1000


async def clear_stale_starts(client: Client, starts_key: str) -> str:
    """Delete the fields of a start counter (``starts``) that are not
    seconds of its window on the server's clock: a slice of
    :data:`_SLICE` fields per ``HSCAN`` and per ``HDEL``, never the
    whole hash in one command (a claim's own sweep stops at
    ``STARTS_MOST`` fields). The window's seconds stay: claims are
    counting in them. Returns what was done, "" for nothing.

    :raises ResponseError: if the key is not a hash (the check reports it)
    """
    seconds, _ = await client.time()
    newest = int(seconds) + 1  # a claim may have moved on to the next second
    oldest = newest - STARTS_WINDOW - 1
    deleted, cursor = 0, 0
    while True:
        cursor, fields = await client.hscan(starts_key, cursor, count=_SLICE)
        stale = [
            name
            for name in fields
            if not (name.isdigit() and oldest < int(name) <= newest)
        ]
        for start in range(0, len(stale), _SLICE):
            deleted += await client.hdel(starts_key, *stale[start : start + _SLICE])
        if cursor == 0:
            break
    if not deleted:
        return ""
    return (
        f"deleted {deleted} fields of {starts_key} outside its {STARTS_WINDOW} s window"
    )
