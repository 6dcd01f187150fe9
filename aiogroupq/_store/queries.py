"""Readers of a queue that run no script: plain commands (``HGET``, ``ZRANGE``,
pipelined ``HMGET``), each reading what the scripts wrote and decoding it
leniently, for display (:func:`~aiogroupq._store.replies.text`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .replies import text

if TYPE_CHECKING:
    from .connection import Client
    from .keys import QueueKeys


async def task_state(client: Client, keys: QueueKeys, task_id: str) -> str | None:
    """The state field of a task's hash, or None if there is no such task."""
    state: Any = await client.hget(keys.task(task_id), "s")
    return None if state is None else text(state)


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A dead-lettered task's stored fields."""

    id: str
    dead_at_ms: float
    envelope: bytes
    reason: str
    traceback: str
    attempts: int


async def dead_rows(client: Client, keys: QueueKeys, limit: int) -> list[DeadRow]:
    """The oldest *limit* dead letters (two round trips: ids, then fields)."""
    entries: Any = await client.zrange(keys.dead, 0, limit - 1, withscores=True)
    return await _dead_rows(client, keys, entries)


async def dead_rows_by_id(
    client: Client, keys: QueueKeys, ids: Sequence[str]
) -> list[DeadRow]:
    """The dead letters among *ids* (others are left out)."""
    async with client.pipeline(transaction=False) as pipe:
        for task_id in ids:
            pipe.zscore(keys.dead, task_id)
        scores: list[Any] = await pipe.execute()
    entries = [
        (task_id.encode(), score)
        for task_id, score in zip(ids, scores, strict=True)
        if score is not None
    ]
    return await _dead_rows(client, keys, entries)


async def _dead_rows(
    client: Client, keys: QueueKeys, entries: Sequence[tuple[bytes, float]]
) -> list[DeadRow]:
    async with client.pipeline(transaction=False) as pipe:
        for task_id, _ in entries:
            pipe.hmget(_task_key(keys, task_id), "e", "x", "tb", "a")
        rows: list[list[Any]] = await pipe.execute()
    out = []
    for (task_id, score), (env, reason, trace, attempts) in zip(
        entries, rows, strict=True
    ):
        if env is not None:  # else purged between the two reads
            out.append(
                DeadRow(
                    text(task_id),
                    float(score),
                    bytes(env),
                    text(reason or b""),
                    text(trace or b""),
                    _count(attempts),
                )
            )
    return out


async def dead_ids(client: Client, keys: QueueKeys, limit: int) -> list[str]:
    """The oldest *limit* dead task ids."""
    ids: Any = await client.zrange(keys.dead, 0, limit - 1)
    return [bytes(task_id).decode() for task_id in ids]


def _count(value: Any) -> int:
    """A stored counter, 0 if it is missing or not an integer."""
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _task_key(keys: QueueKeys, task_id: bytes) -> bytes:
    # The key of a stored id exactly as stored, even if it is not UTF-8:
    # surrogateescape gives back the original bytes.
    return keys.task(task_id.decode(errors="surrogateescape")).encode(
        errors="surrogateescape"
    )
