"""The Lua scripts, run with EVALSHA; the only place that reads their replies.

Each ``_lua/<name>.lua`` is prefixed with ``_lua/_lib.lua`` and read once at
import. Its first line is a ``#!lua`` shebang: scripts that add work (enqueue,
claim) have no flags, so that under ``maxmemory`` Redis refuses them before
they write anything; scripts that let work finish (finish, heartbeat, recover,
cancel, dead, wait, identity) carry ``allow-oom``. The SHA is computed
locally, so the hot path is a single EVALSHA. A ``NOSCRIPT`` reply
(``SCRIPT FLUSH``, a restart, a failover) means the script did not run; the
call is then sent again as EVAL with the whole source, which cannot answer
``NOSCRIPT`` however often the cache is flushed, and the script is loaded
again so that later calls go back to EVALSHA.

Replies are read here too, and they carry bytes that anything with access to
Redis may have written: what is decoded for display (ids, states, reasons)
is decoded leniently and never raises.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import NoScriptError, OutOfMemoryError

from .errors import QueueFullError

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.typing import EncodableT

    from ._keys import QueueKeys


def _read(name: str) -> bytes:
    return files("aiogroupq").joinpath("_lua", name).read_bytes()


_LIB: Final = _read("_lib.lua")


class Script:
    """A ``_lua/<name>.lua`` file (after the shared library) run with EVALSHA."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        body = _read(f"{name}.lua")
        # The shebang (script flags such as allow-oom) must stay the first line.
        shebang, _, rest = (
            body.partition(b"\n")
            if body.startswith(b"#!")
            else (
                b"",
                b"",
                body,
            )
        )
        self.source = shebang + b"\n" + _LIB + b"\n" + rest
        self.sha = hashlib.sha1(self.source).hexdigest()

    async def __call__(
        self,
        client: Redis,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        all_keys = (
            keys.ready,
            keys.delayed,
            keys.leases,
            keys.wake,
            keys.fence,
            keys.dead,
            *extra_keys,
        )
        argv = (keys.prefix, *args)
        try:
            try:
                return await client.evalsha(self.sha, len(all_keys), *all_keys, *argv)
            except NoScriptError:
                pass
            # Not run. Loading first and retrying EVALSHA can meet a second
            # flush in between (SCRIPT FLUSH on a timer does it); EVAL carries
            # the source, so it runs whatever the cache holds. The load keeps
            # the script cached for the next calls; EVAL alone may not (newer
            # Redis versions evict scripts that only EVAL brought in).
            await client.script_load(self.source)
            source = self.source.decode()
            return await client.eval(source, len(all_keys), *all_keys, *argv)
        except OutOfMemoryError as exc:  # refused before it ran: nothing written
            raise QueueFullError(str(exc)) from exc


ENQUEUE: Final = Script("enqueue")
CLAIM: Final = Script("claim")
FINISH: Final = Script("finish")
HEARTBEAT: Final = Script("heartbeat")
RECOVER: Final = Script("recover")
CANCEL: Final = Script("cancel")
DEAD: Final = Script("dead")
WAIT: Final = Script("wait")
IDENTITY: Final = Script("identity")

ALL_SCRIPTS: Final = (
    ENQUEUE,
    CLAIM,
    FINISH,
    HEARTBEAT,
    RECOVER,
    CANCEL,
    DEAD,
    WAIT,
    IDENTITY,
)


@dataclass(frozen=True, slots=True)
class NewTask:
    """One task as ``enqueue.lua`` takes it."""

    id: str
    group: str | None
    envelope: bytes
    delay_ms: int
    max_attempts: int
    dedup_key: str | None
    run_at_ms: int = 0  # due time in Unix ms (server clock); wins over delay_ms


async def enqueue(
    client: Redis,
    keys: QueueKeys,
    tasks: Sequence[NewTask],
    *,
    dedup_window_ms: int,
) -> list[str]:
    """Add *tasks* in one atomic call; return each task's id (a deduplicated
    task's is the id of the task that first used its key)."""
    args: list[EncodableT] = [dedup_window_ms, len(tasks)]
    for t in tasks:
        args += (
            t.id,
            t.group or "",
            t.envelope,
            t.delay_ms,
            t.max_attempts,
            t.dedup_key or "",
            t.run_at_ms,
        )
    return [task_id.decode() for task_id in await ENQUEUE(client, keys, (), args)]


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task the claim handed to us."""

    id: str
    envelope: bytes
    attempt: int
    token: int


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """What ``claim.lua`` returned."""

    tasks: list[Claimed]
    wait_ms: int  # until the next delayed task is due; -1 when there is none
    more: bool  # runnable entries are left in the ready list


async def claim(
    client: Redis,
    keys: QueueKeys,
    consumer: str,
    *,
    k: int,
    lease_ms: int,
    scan_limit: int,
    promote_limit: int = 1000,
    recover_limit: int = 100,
) -> ClaimReply:
    """Recover, promote, then claim up to *k* tasks for *consumer*."""
    # The nonce makes a re-sent call (redis-py retrying after a lost reply)
    # return what the first one claimed instead of claiming more.
    nonce = os.urandom(8).hex()
    reply = await CLAIM(
        client,
        keys,
        (keys.inflight(consumer), keys.last_claim(consumer)),
        (consumer, k, lease_ms, scan_limit, promote_limit, recover_limit, nonce),
    )
    tasks = [
        Claimed(reply[i].decode(), reply[i + 1], int(reply[i + 2]), int(reply[i + 3]))
        for i in range(2, len(reply), 4)
    ]
    return ClaimReply(tasks, int(reply[0]), reply[1] == 1)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's result for ``finish.lua``."""

    id: str
    token: int
    kind: str  # "ok" | "retry" | "dead" | "halt" | "cancel" | "back"
    arg1: str | int | bytes = ""
    arg2: str = ""


APPLIED: Final = 1
DUPLICATE: Final = 2
LEASE_LOST: Final = 0
#: applied as "cancel": a cancellation was requested before this outcome
APPLIED_AS_CANCEL: Final = 3


async def finish(
    client: Redis, keys: QueueKeys, outcomes: Sequence[Outcome], *, retention_ms: int
) -> list[int]:
    """Apply *outcomes*; return APPLIED, APPLIED_AS_CANCEL, DUPLICATE or
    LEASE_LOST for each."""
    args: list[EncodableT] = [retention_ms, len(outcomes)]
    for o in outcomes:
        args += (o.id, o.token, o.kind, o.arg1, o.arg2)
    return [int(code) for code in await FINISH(client, keys, (), args)]


async def recover(
    client: Redis,
    keys: QueueKeys,
    consumer: str,
    *,
    counted: bool,
    keep: Sequence[str] = (),
) -> int:
    """Give back *consumer*'s held tasks except *keep*; return how many."""
    args: list[EncodableT] = [1 if counted else 0, consumer, *keep]
    return int(await RECOVER(client, keys, (keys.inflight(consumer),), args))


async def identity(
    client: Redis,
    keys: QueueKeys,
    name: str,
    op: str,
    me: str,
    ttl_ms: int,
    dead_holder: str = "",
) -> str:
    """Run an ``identity.lua`` operation; return "" or the other holder."""
    holder = await IDENTITY(
        client, keys, (keys.consumer(name),), (op, me, ttl_ms, dead_holder)
    )
    return bytes(holder).decode()


async def task_state(client: Redis, keys: QueueKeys, task_id: str) -> str | None:
    """The state field of a task's hash, or None if there is no such task."""
    state: Any = await client.hget(keys.task(task_id), "s")
    return None if state is None else _text(state)


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A dead-lettered task's stored fields."""

    id: str
    dead_at_ms: float
    envelope: bytes
    reason: str
    traceback: str
    attempts: int


async def dead_rows(client: Redis, keys: QueueKeys, limit: int) -> list[DeadRow]:
    """The oldest *limit* dead letters (two round trips: ids, then fields)."""
    entries: Any = await client.zrange(keys.dead, 0, limit - 1, withscores=True)
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
                    _text(task_id),
                    float(score),
                    bytes(env),
                    _text(reason or b""),
                    _text(trace or b""),
                    _count(attempts),
                )
            )
    return out


def _text(value: Any) -> str:
    """Stored bytes as text for display; invalid UTF-8 shows as U+FFFD."""
    return bytes(value).decode(errors="replace")


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


LOST: Final = 0
ALIVE: Final = 1
CANCEL_REQUESTED: Final = 2


async def heartbeat(
    client: Redis, keys: QueueKeys, leases: Sequence[tuple[str, int]], *, lease_ms: int
) -> list[int]:
    """Extend *leases* (task id, token); return ALIVE, LOST or CANCEL_REQUESTED
    for each."""
    args: list[EncodableT] = [lease_ms]
    for task_id, token in leases:
        args += (task_id, token)
    return [int(code) for code in await HEARTBEAT(client, keys, (), args)]


NOT_FOUND: Final = 0
CANCELLED: Final = 1
REQUESTED: Final = 2
FINISHED: Final = 3


async def cancel(
    client: Redis, keys: QueueKeys, task_id: str, *, retention_ms: int
) -> int:
    """Cancel *task_id*: NOT_FOUND, CANCELLED, REQUESTED (running) or FINISHED."""
    return int(await CANCEL(client, keys, (), (retention_ms, task_id)))


async def dead_action(
    client: Redis, keys: QueueKeys, op: str, targets: Sequence[str]
) -> int:
    """``requeue``/``purge`` dead task ids or ``release`` halted groups; return
    how many were acted on."""
    if not targets:
        return 0
    return int(await DEAD(client, keys, (), (op, *targets)))


async def dead_ids(client: Redis, keys: QueueKeys, limit: int) -> list[str]:
    """The oldest *limit* dead task ids."""
    ids: Any = await client.zrange(keys.dead, 0, limit - 1)
    return [bytes(task_id).decode() for task_id in ids]


async def wait_done(
    client: Redis, keys: QueueKeys, task_id: str, timeout: float, block_cap: float
) -> tuple[str | None, bytes | None, str]:
    """Wait up to *timeout* s for *task_id* to end; return (state, result, reason).

    ``wait.lua`` marks the task so that its end pushes a token on
    ``done:<id>``; we block on that list instead of polling, and put the token
    back so that other waiters wake too. *block_cap* keeps each blocking pop
    under the client's socket timeout.
    """
    done = keys.done(task_id)
    deadline = time.monotonic() + timeout
    while True:
        row: Any = await WAIT(client, keys, (), (task_id,))
        if not row:
            return None, None, ""
        state = _text(row[0])
        if state not in ("queued", "delayed", "running"):
            reason = _text(row[2]) if row[2] else ""
            return state, row[1] or None, reason
        left = deadline - time.monotonic()
        if left <= 0:
            return state, None, ""
        if await client.blpop([done], timeout=min(left, block_cap)) is not None:
            row = await WAIT(client, keys, (), (task_id,))
            if row and _text(row[0]) not in ("queued", "delayed", "running"):
                await client.rpush(done, "1")  # for the other waiters
            # else a stale token (a dead letter requeued since): dropped
