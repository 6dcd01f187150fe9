"""Reading, creating and checking a queue's partition layout in Redis.

Partition 0's ``conf`` field ``parts`` is the queue's layout (see
``_store/partition.py``); every other partition holds a copy, which its
``enqueue.lua`` checks each task against. A repartition changes partition 0
first, then the others (``_store/repartition.py``), so a partition's copy may lag
behind partition 0's for a moment, or for good if whoever changed it was
interrupted: any client that finds one lagging brings it up to date (the step
it missed is the same for everyone), which makes the change complete even
when its operator died half-way.

A ``conf`` of partition 0 that is not a hash (damage) is refused with
:class:`~aiogroupq.CorruptQueueError`; the check and the repair, which
must go on, find the layout again from the other partitions' copies
(:func:`recover`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from ..errors import ConfigurationError, CorruptQueueError
from . import scripts as _scripts
from .partition import MAX_PARTITIONS, Layout, Partitions
from .wrongtype import corrupt_key, is_wrong_type

if TYPE_CHECKING:
    from .connection import Client

logger = logging.getLogger("aiogroupq")


#: what a reader loses with partition 0's conf (CorruptQueueError's detail)
UNREADABLE: Final = "the queue's settings and partition layout cannot be read"
#: partitions whose layout copies :func:`recover` asks for per round trip
_PROBE: Final = 16


async def read(client: Client, parts: Partitions) -> Layout:
    """The layout partition 0 holds (not remembered in *parts*).

    :raises CorruptQueueError: if partition 0's ``conf`` is not a hash
    """
    key = parts.keys(0).conf
    try:
        stored: Any = await client.hget(key, "parts")
    except ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        raise await corrupt_key(client, key, "hash", UNREADABLE) from None
    return Layout.parse(stored)


async def read_or_recover(client: Client, parts: Partitions) -> Layout:
    """The layout partition 0 holds, or while it cannot be read (its
    ``conf`` damaged), the one the other partitions' copies give
    (:func:`recover`): for the check and the repair, which must see every
    partition of a damaged queue."""
    try:
        return await read(client, parts)
    except CorruptQueueError:
        return await recover(client, parts)


async def recover(client: Client, parts: Partitions) -> Layout:
    """The layout of a queue whose partition 0 cannot tell it, from the
    copies partitions 1, 2, ... hold: the furthest along where they differ
    (a step of a repartition reaches partition 0 first, then the others,
    so a copy may lag one step behind, never lead), the lowest partition's
    among equals; one partition if none holds a readable copy."""
    copies: dict[int, Layout] = {}
    low, high = 1, _PROBE
    while low < high:
        async with client.pipeline(transaction=False) as pipe:
            for partition in range(low, high):
                pipe.hget(parts.keys(partition).conf, "parts")
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        for partition, raw in zip(range(low, high), replies, strict=True):
            if isinstance(raw, Exception):
                if not is_wrong_type(raw):
                    raise raw
                continue  # that copy is damaged too
            try:
                copy = Layout.parse(raw)
            except ConfigurationError:
                continue
            if raw is not None:
                copies[partition] = copy
        # Partitions beyond the probe hold copies only when a copy counts them.
        wanted = max((c.count for c in copies.values()), default=1)
        low, high = high, min(max(high, wanted), MAX_PARTITIONS)
    found = list(copies.values())
    for copy in found:
        if not any(_lags(copy, other) for other in found if other != copy):
            return copy
    return Layout()


async def open_layout(client: Client, parts: Partitions, requested: int | None) -> None:
    """Learn the queue's layout into *parts*; with *requested* > 1, create it
    on a queue that has none and holds no task.

    :param requested: the partition count the caller was configured with
        (None: whatever is stored)
    :raises ConfigurationError: if the stored layout has another count
    """
    if requested is None or requested == 1:
        layout = await read(client, parts)
    else:
        stored = await _scripts.meta(client, parts.keys(0), "create", str(requested))
        layout = Layout.parse(stored)
    if requested is not None and requested not in (layout.parts, layout.target):
        if layout.parts == 1 and not layout.migrating:
            why = "it already holds tasks in the one partition it has"
        else:
            why = f"it has {layout.parts} partitions"
            if layout.target is not None:
                why += f" and is being repartitioned to {layout.target}"
        raise ConfigurationError(
            f"queue {parts.queue!r} cannot be used with partitions={requested}: "
            f"{why}. Pass partitions=None to use the stored layout, or "
            f"repartition the queue (aiogroupq repartition --queue {parts.queue} --to "
            f"{requested})"
        )
    parts.layout = layout
    await heal(client, parts)


async def refresh(client: Client, parts: Partitions) -> bool:
    """Read the layout again into *parts*; return whether it changed."""
    layout = await read(client, parts)
    changed = layout != parts.layout
    parts.layout = layout
    if changed:
        await heal(client, parts)
    return changed


async def heal(client: Client, parts: Partitions) -> None:
    """Bring every partition whose copy of the layout lags one step behind
    partition 0's (or was never written) up to it."""
    layout = parts.layout
    if layout.count == 1:
        return
    others = [parts.keys(p) for p in range(1, layout.count)]
    async with client.pipeline(transaction=False) as pipe:
        for keys in others:
            pipe.hget(keys.conf, "parts")
        copies: list[Any] = await pipe.execute(raise_on_error=False)
    for keys, raw in zip(others, copies, strict=True):
        if isinstance(raw, Exception):
            if not is_wrong_type(raw):
                raise raw
            continue  # a damaged conf: the check reports it, --repair rebuilds it
        try:
            copy = Layout.parse(raw)
        except ConfigurationError:
            continue  # damage: the check reports it
        if not _lags(copy, layout):
            continue
        was = await _scripts.meta(client, keys, "cas", copy.text(), layout.text())
        if was == copy.text():
            logger.info(
                "queue %r partition %d: layout %s brought up to %s",
                parts.queue,
                keys.partition,
                copy.text(),
                layout.text(),
            )


def _lags(copy: Layout, layout: Layout) -> bool:
    """Whether a partition holding *copy* missed the step to *layout* (or
    was never given one)."""
    if copy == layout:
        return False
    if copy == Layout():
        return True
    if layout.migrating:
        return copy == Layout(layout.parts)
    return copy.target == layout.parts
