"""Reading, creating and checking a queue's partition layout in Redis.

Partition 0's ``conf`` field ``parts`` is the queue's layout (see
``_store/partition.py``); every other partition holds a copy, which its
``enqueue.lua`` checks each task against. A repartition changes partition 0
first, then the others (``_inspect/repartition.py``), so a partition's copy may lag
behind partition 0's for a moment, or for good if whoever changed it was
interrupted: any client that finds one lagging brings it up to date (the step
it missed is the same for everyone), which makes the change complete even
when its operator died half-way.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from . import scripts as _scripts
from .partition import Layout, Partitions

if TYPE_CHECKING:
    from .connection import Client

logger = logging.getLogger("aiogroupq")


async def read(client: Client, parts: Partitions) -> Layout:
    """The layout partition 0 holds (not remembered in *parts*)."""
    stored: Any = await client.hget(parts.keys(0).conf, "parts")
    return Layout.parse(stored)


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
        copies: list[Any] = await pipe.execute()
    for keys, raw in zip(others, copies, strict=True):
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
