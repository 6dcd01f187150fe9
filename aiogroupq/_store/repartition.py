"""Changing a live queue's partition count from K to K' without breaking any
group's order (see docs/scaling.md).

1. **Start**: every partition's layout becomes ``K>K'`` (partition 0 first,
   with a compare-and-set, so two operators cannot start two moves). From
   then on a new task of a group whose partition changes is offered to its
   old partition first, which keeps it while the group has live tasks there
   and answers "moved" once it has none; the producer then sends it to the
   new partition. A group's tasks in its old partition therefore all end (or
   die) before its new partition holds any: a group is never live in two
   partitions. Ungrouped tasks go by the new count at once. Consumers claim
   from the union of old and new partitions meanwhile. Each group's own
   settings (concurrency, rate, max size, priority, weight, ordering,
   pause) are
   copied to its new partition, before and after the layout changes;
   ``Admin.set_group`` writes both while the move is under way.
2. **Finish**, once no group is live in a partition other than its new one
   and no partition beyond the new count holds tasks (dead letters
   included): every layout becomes ``K'`` (partition 0 first). Until then,
   :func:`finish` only reports what it is waiting for: a group that never
   drains (halted behind a dead task, paused) keeps the move open.

Both steps are idempotent, and a step half done (its operator died) is
completed by the next client that reads the layout (``_layout.heal``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from ..errors import ConfigurationError
from . import layout as _layout, scripts as _scripts
from .connection import node_of
from .partition import MAX_PARTITIONS, Layout, Partitions, check_count, crc
from .schema import GROUP_SETTINGS, TOTALS

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys

#: blockers :func:`finish` lists at most (the rest are counted)
_SHOWN: Final = 20


async def start(client: Client, parts: Partitions, target: int) -> Layout:
    """Begin moving the queue to *target* partitions; return the layout.

    :raises ConfigurationError: for a bad count, or while another
        repartition (to another count) is under way
    """
    check_count("partitions", target)
    layout = await _layout.read(client, parts)
    if layout.target == target:
        parts.layout = layout  # started already: complete the start
        await _layout.heal(client, parts)
        await _move_settings(client, parts, layout)
        return layout
    if layout.migrating:
        raise ConfigurationError(
            f"queue {parts.queue!r} is being repartitioned from {layout.parts} to "
            f"{layout.target} partitions; finish that first"
        )
    if layout.parts == target:
        raise ConfigurationError(
            f"queue {parts.queue!r} has {target} partitions already"
        )
    moving = Layout(layout.parts, target)
    # Before the switch too: a group may move as soon as it changes.
    await _move_settings(client, parts, moving)
    was = await _scripts.meta(
        client, parts.keys(0), "cas", layout.text(), moving.text()
    )
    if was != layout.text():
        raise ConfigurationError(
            f"queue {parts.queue!r}: its layout changed meanwhile ({was}); try again"
        )
    parts.layout = moving
    await _layout.heal(client, parts)
    # Again after: a set_group in between wrote the old partition only.
    await _move_settings(client, parts, moving)
    return moving


async def _move_settings(client: Client, parts: Partitions, moving: Layout) -> None:
    """Copy each group's own settings to the partition it moves to, with
    the ``control.lua`` calls a ``set_group`` (and ``pause_group``) makes
    there, so that the flags they need (``gc``, ``pu``) follow. One SCAN of
    each old partition's settings keys, one call per group that moves."""
    for partition in range(moving.parts):
        keys = parts.keys(partition)
        skip = len(keys.prefix) + len("gconf:")
        async for raw in client.scan_iter(
            match=keys.pattern("gconf:"), count=1000, **node_of(client, keys.ready)
        ):
            name = bytes(raw)[skip:]
            try:
                homes = moving.homes(crc(name.decode("utf-8", "surrogatepass")))
            except UnicodeDecodeError:
                continue  # no group name aiogroupq writes
            if len(homes) < 2:
                continue
            try:
                stored: dict[Any, Any] = await client.hgetall(raw)
            except ResponseError:
                continue  # damaged: the check reports it
            conf = {
                bytes(k).decode(errors="replace"): bytes(v) for k, v in stored.items()
            }
            new = parts.keys(homes[1])
            values = [conf.get(f, b"") for f in GROUP_SETTINGS]
            await _scripts.control(client, new, "group", name, *values)
            if conf.get("p") == b"1":
                await _scripts.control(client, new, "pause", name)


async def blockers(client: Client, parts: Partitions) -> tuple[list[str], int]:
    """What keeps the move from finishing: up to 20 reasons, and how many
    there are in all (0: it may finish)."""
    layout = parts.layout
    assert layout.target is not None
    target = layout.target
    shown: list[str] = []
    total = 0
    for keys in parts.all():
        async for name in _live_groups(client, keys):
            home = crc(name) % target
            if home != keys.partition:
                total += 1
                if len(shown) < _SHOWN:
                    shown.append(
                        f"group {name!r} has live tasks in partition "
                        f"{keys.partition}; it moves to partition {home} once "
                        "they end"
                    )
        if keys.partition >= target:
            left = await _held(client, keys)
            if left:
                total += 1
                if len(shown) < _SHOWN:
                    shown.append(
                        f"partition {keys.partition} (beyond the new count) still "
                        f"holds {left} tasks or dead letters: let them run, or "
                        "requeue or purge the dead letters"
                    )
    return shown, total


async def finish(client: Client, parts: Partitions) -> tuple[list[str], int]:
    """Finish the move if nothing blocks it; return :func:`blockers`' answer
    (no reasons: finished, or there was no move to finish).

    :raises ConfigurationError: if no repartition is under way
    """
    layout = await _layout.read(client, parts)
    parts.layout = layout
    if layout.target is None:
        # A finish that died after switching partition 0 left the retired
        # partitions behind: this one completes it.
        if await _retire_beyond(client, parts, layout):
            return [], 0
        raise ConfigurationError(f"queue {parts.queue!r} is not being repartitioned")
    await _layout.heal(client, parts)
    shown, total = await blockers(client, parts)
    if total:
        return shown, total
    done = Layout(layout.target)
    was = await _scripts.meta(client, parts.keys(0), "cas", layout.text(), done.text())
    if was != layout.text():
        raise ConfigurationError(
            f"queue {parts.queue!r}: its layout changed meanwhile ({was}); try again"
        )
    parts.layout = done
    await _layout.heal(client, parts)
    await _retire_beyond(client, parts, done)
    return [], 0


async def _retire_beyond(client: Client, parts: Partitions, done: Layout) -> int:
    """Give each partition beyond *done*'s count that still holds another
    layout *done*'s (so that it refuses any task still sent by a client that
    lags behind: it is empty) and fold its totals into partition 0's; the
    number of partitions retired so.

    The old count's partitions are those holding a layout of their own, up
    to the first without; they are retired from the last one down, so that
    an interruption leaves the ones not yet retired before that first gap.
    (*done* = 1 is stored as no layout at all.)
    """
    lagging: list[tuple[QueueKeys, str]] = []
    for partition in range(done.parts, MAX_PARTITIONS):
        keys = parts.keys(partition)
        raw = await client.hget(keys.conf, "parts")
        if raw is None:
            break
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        if text != done.text():
            lagging.append((keys, text))
    for keys, text in reversed(lagging):
        await _scripts.meta(client, keys, "cas", text, done.text())
        await _fold_totals(client, keys, parts.keys(0))
    return len(lagging)


async def _fold_totals(client: Client, retired: QueueKeys, first: QueueKeys) -> None:
    """Add a retired partition's lifetime totals to partition 0's, so that
    ``stats()`` keeps counting the tasks it ran (two calls on two slots: an
    interruption between them may count some twice, never lose them)."""
    values: list[Any] = await client.hmget(retired.stats, list(TOTALS))
    counts = {name: int(raw) for name, raw in zip(TOTALS, values, strict=True) if raw}
    if not counts:
        return
    async with client.pipeline(transaction=False) as pipe:
        for name, count in counts.items():
            pipe.hincrby(first.stats, name, count)
        await pipe.execute()
    await client.hdel(retired.stats, *counts)


async def _live_groups(client: Client, keys: QueueKeys) -> Any:
    """The groups with live tasks in one partition (their ``grp:`` hashes
    exist exactly while they are live), by a SCAN of that partition."""
    prefix = len(keys.prefix) + len("grp:")
    async for raw in client.scan_iter(
        match=keys.pattern("grp:"), count=1000, **node_of(client, keys.ready)
    ):
        yield bytes(raw)[prefix:].decode(errors="replace")


async def _held(client: Client, keys: QueueKeys) -> int:
    """Tasks and dead letters a partition still holds."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.llen(keys.ready)
        pipe.zcard(keys.pready)
        pipe.zcard(keys.delayed)
        pipe.zcard(keys.leases)
        pipe.zcard(keys.dead)
        pipe.zcard(keys.backlog)
        counts: list[Any] = await pipe.execute()
    return sum(int(c) for c in counts)
