"""Operations on all of one group's tasks in one partition
(``Admin.cancel_group``, ``Admin.purge_group``): bounded script calls in a
loop, each atomic on its own.

What a group holds is found from its own keys where they say it: its line
(``park:<g>``) and its slot holders (the ``h:<id>`` fields of ``grp:<g>``).
Two kinds of tasks have no index by group, and are found by walking a
queue-wide sorted set in chunks: tasks in their first delay (the delayed
ZSET, walked only while the group counts some) and dead letters (the dead
ZSET, walked whole).
"""

from __future__ import annotations

__all__ = ("cancel_group", "purge_group", "release_consumer")

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from . import scripts as _scripts
from .fanout import each_partition
from .wrongtype import corrupt_key, is_wrong_type

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys
    from .partition import Partitions

_HOLDER = b"h:"


async def cancel_group(
    client: Client, keys: QueueKeys, group: str, *, running: bool, retention_ms: int
) -> int:
    """Cancel *group*'s queued and delayed tasks in the partition of *keys*
    (with *running*, ask for its running ones too); return how many tasks
    were cancelled plus how many running ones were asked to be.

    The tasks in their first delay go first, then the line, from its head,
    then the slot holders: a delayed task that comes due meanwhile joins
    the line or the holders, read after it (the other way round it could
    leave the delayed set behind the walk and join a line already read,
    and be missed even with the group paused); a holder cancelled passes
    its slot on to the line, which is then empty of the tasks there were
    (so the walk of the delayed set leaves alone a holder it meets there,
    a retry in its backoff: its slot would go to a task of the line, which
    could start before the line's call).
    """
    batch = _scripts.CANCEL_GROUP_BATCH

    async def call(**target: Any) -> _scripts.GroupCancelled:
        return await _scripts.cancel_group(
            client, keys, group, retention_ms=retention_ms, **target
        )

    # No task given: the group's counts alone, to know whether it has tasks
    # in their first delay to look for.
    r = await call(line=(0, 0), running=False)
    done = 0
    if r.delayed > 0:
        chunks = aclosing(_members(client, keys.delayed, batch, "the delayed tasks"))
        async with chunks as found:
            async for ids in found:
                r = await call(ids=ids, first=True, running=False)
                done += r.cancelled
                if r.delayed == 0:
                    break  # every one is found: the rest of the set is others'
    # The line as long as it was at the first call, and the tasks in their
    # first delay that may join it meanwhile: this ends however fast the
    # group's tasks are enqueued.
    skip, budget = 0, batch
    first = True
    while budget > 0:
        count = min(batch, budget)
        r = await call(line=(skip, count), running=False)
        done += r.cancelled
        if first:
            budget = r.line + (r.looked - r.kept) + r.delayed
            first = False
        budget -= r.looked
        skip += r.kept
        if r.looked < count:
            break
    if r.holders > 0:
        key = keys.group(group)
        try:
            fields: Any = await client.hgetall(key)
        except ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise await corrupt_key(client, key, "hash", "the group's state") from None
        holders = [
            text
            for f in fields
            if bytes(f).startswith(_HOLDER)
            and (text := _text(bytes(f)[len(_HOLDER) :])) is not None
        ]
        for start in range(0, len(holders), batch):
            r = await call(ids=holders[start : start + batch], running=running)
            done += r.cancelled + r.asked
    return done


async def purge_group(client: Client, keys: QueueKeys, group: str) -> int:
    """Delete *group*'s dead letters in the partition of *keys*; return how
    many. Nothing indexes dead letters by group: this reads the whole dead
    ZSET, :data:`~.scripts.DEAD_BATCH` ids and one pipelined ``HGET`` of
    their groups per round trip, and purges the group's with ``dead.lua``
    as ``Admin.purge_dead`` does."""
    name = group.encode()
    total = 0
    chunks = aclosing(
        _members(client, keys.dead, _scripts.DEAD_BATCH, "the dead letters")
    )
    async with chunks as found:
        async for ids in found:
            async with client.pipeline(transaction=False) as pipe:
                for task_id in ids:
                    pipe.hget(keys.task(task_id), "g")
                groups: list[Any] = await pipe.execute(raise_on_error=False)
            mine = [i for i, g in zip(ids, groups, strict=True) if g == name]
            if mine:
                total += await _scripts.dead_action(client, keys, "purge", mine)
    return total


async def _members(
    client: Client, key: str, chunk: int, what: str
) -> AsyncGenerator[list[str]]:
    """The members of sorted set *key*, in score order, *chunk* a read; a
    key of another type is a :class:`~aiogroupq.CorruptQueueError` saying
    *what* it holds.

    A cursor on (score, member) rather than on rank: the caller removes
    members as it goes, and others add and remove them meanwhile, which
    shifts ranks. Members of equal score come in member order; those of the
    last score read are read again with the next chunk and skipped, so a
    score shared by very many members makes the reads longer, never wrong.
    """
    low: float | None = None
    seen: set[bytes] = set()  # members of score *low* already yielded
    while True:
        asked = chunk + len(seen)
        try:
            rows: list[Any] = await client.zrange(
                key,
                "-inf" if low is None else repr(low),
                "+inf",
                byscore=True,
                offset=0,
                num=asked,
                withscores=True,
            )
        except ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            raise await corrupt_key(client, key, "zset", what) from None
        fresh = [(bytes(m), s) for m, s in rows if not (s == low and m in seen)]
        if not fresh:
            return
        # Members seen before may be gone (the caller removed them): then
        # more than *chunk* are fresh, and the rest come with the next read.
        cut, fresh = len(fresh) > chunk, fresh[:chunk]
        top = fresh[-1][1]
        if top != low:
            seen = set()
        seen.update(m for m, s in fresh if s == top)
        low = top
        yield [text for m, _ in fresh if (text := _text(m)) is not None]
        if len(rows) < asked and not cut:
            return


def _text(member: bytes) -> str | None:
    """A member as a task id; None for one that cannot be (not UTF-8)."""
    try:
        return member.decode()
    except UnicodeDecodeError:
        return None


async def release_consumer(
    client: Client, parts: Partitions, name: str, *, retention_ms: int
) -> int:
    """Hand back the tasks consumer *name* holds, in every partition, as the
    recovery at its lease's end would: each to the front of its group, its
    attempt counted (dead-lettered past its last one, cancelled if that was
    asked). Fenced as that recovery is: its tokens no longer own the tasks,
    so a late heartbeat, finish or top-up of the consumer is refused. Return
    how many tasks went back. The caller judged that it may
    (``_inspect/consumers.py`` ``check_releasable``).
    """

    async def hand_back(keys: QueueKeys) -> int:
        reply = await _scripts.RECOVER(
            client, keys, (keys.inflight(name),), ("r", name, retention_ms)
        )
        return int(reply[0])

    return sum(await each_partition(parts.all(), hand_back))
