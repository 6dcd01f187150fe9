"""The Lua scripts, run with EVALSHA; the only place that reads their replies.

Each ``_lua/<name>.lua`` names the helpers it uses with ``--- @include "x"``
lines, resolved here from ``_lua/lib/x.lua`` (each helper once, after the
helpers it includes itself), and is read once at import. Its first line is a
``#!lua`` shebang: enqueue has no flags, so that under ``maxmemory`` Redis
refuses it before it writes anything; every other script carries
``allow-oom``, so that work already queued keeps draining. The SHA is computed
locally, so the hot path is a single EVALSHA. A ``NOSCRIPT`` reply
(``SCRIPT FLUSH``, a restart, a failover) means the script did not run; the
call is then sent again as EVAL with the whole source, which cannot answer
``NOSCRIPT`` however often the cache is flushed, and the script is loaded
again so that later calls go back to EVALSHA.

A script that meets a damaged key answers before writing anything; the
error's text says which key, and :func:`_raise_for` turns it into
:class:`~aiogroupq.CorruptQueueError`. Replies are read here too, and they
carry bytes that anything with access to Redis may have written: what is
decoded for display (ids, states, reasons) is decoded leniently and never
raises.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Final

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    NoScriptError,
    OutOfMemoryError,
    ResponseError,
    TryAgainError,
)

from ..errors import CorruptQueueError, QueueFullError
from .connection import REDIS_FAILURES, cluster_glitches

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .connection import Client
    from .keys import QueueKeys


def _read(path: str) -> str:
    return files("aiogroupq").joinpath("_lua", path).read_text(encoding="utf-8")


_INCLUDE: Final = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)


def _resolve(body: str, done: set[str]) -> str:
    """*body* with each ``--- @include "x"`` replaced by ``lib/x.lua`` (itself
    resolved first), or by nothing when an earlier include brought it in."""

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in done:
            return ""
        done.add(name)
        return _resolve(_read(f"lib/{name}.lua"), done)

    return _INCLUDE.sub(include, body)


class Script:
    """A ``_lua/<name>.lua`` file with its includes, run with EVALSHA."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str) -> None:
        self.name = name
        body = _read(f"{name}.lua")
        # The shebang (script flags such as allow-oom) must stay the first line.
        shebang, _, rest = (
            body.partition("\n") if body.startswith("#!") else ("", "", body)
        )
        self.source = (shebang + "\n" + _resolve(rest, set())).encode()
        self.sha = hashlib.sha1(self.source).hexdigest()

    async def __call__(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        with _glitches(client):
            return await self._call(client, keys, extra_keys, args)

    async def _call(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        all_keys = _fixed(keys, extra_keys)
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
            await self.load(client, keys)
            source = self.source.decode()
            return await client.eval(source, len(all_keys), *all_keys, *argv)
        except OutOfMemoryError as exc:  # refused before it ran: nothing written
            raise QueueFullError(str(exc)) from exc
        except ResponseError as exc:
            _raise_for(exc)
            raise

    async def load(self, client: Client, keys: QueueKeys) -> None:
        """``SCRIPT LOAD`` on the server of *keys*: with a cluster, the node
        owning their slot only (a load sent to every primary would fail
        while one of them is down; the EVAL that follows runs anyway)."""
        if not isinstance(client, RedisCluster):
            await client.script_load(self.source)
            return
        with contextlib.suppress(*REDIS_FAILURES):
            node = client.get_node_from_key(keys.ready)
            await client.execute_command("SCRIPT LOAD", self.source, target_nodes=node)

    async def replicated(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        """Run the script, then ``WAIT replicas timeout_ms`` on the same
        connection; return its reply and how many replicas acknowledged its
        writes (and every write before them: replication is one ordered
        stream). It is sent again only after ``NOSCRIPT`` or a cluster
        redirection, which mean it did not run."""
        with _glitches(client):
            return await self._replicated(
                client,
                keys,
                extra_keys,
                args,
                replicas=replicas,
                timeout_ms=timeout_ms,
            )

    async def _replicated(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        all_keys = _fixed(keys, extra_keys)
        argv = (keys.prefix, *args)
        reply: Any = None
        for _ in range(5):
            async with client.pipeline(transaction=False) as pipe:
                pipe.execute_command(
                    "EVALSHA", self.sha, len(all_keys), *all_keys, *argv
                )
                if isinstance(client, RedisCluster):
                    node = client.get_node_from_key(keys.ready)
                    pipe.execute_command(
                        "WAIT", replicas, timeout_ms, target_nodes=node
                    )
                    reply, acked = await pipe.execute(  # type: ignore[call-arg]
                        raise_on_error=False, allow_redirections=False
                    )
                else:
                    pipe.execute_command("WAIT", replicas, timeout_ms)
                    reply, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                await self.load(client, keys)
                continue
            if isinstance(client, RedisCluster) and isinstance(
                reply, AskError | TryAgainError
            ):
                # Not run: a keyed read follows the redirection, which
                # updates the client's slot map; then send both again.
                await client.hget(keys.conf, "parts")
                continue
            break
        if isinstance(reply, OutOfMemoryError):
            raise QueueFullError(str(reply)) from reply
        if isinstance(reply, ResponseError):
            _raise_for(reply)
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception):
            raise acked
        return reply, int(acked)


def _glitches(client: Client) -> contextlib.AbstractContextManager[None]:
    # Only a cluster client has the failover glitch; on a plain client an
    # AttributeError from redis-py stays what it is.
    if isinstance(client, RedisCluster):
        return cluster_glitches()
    return contextlib.nullcontext()


def _fixed(keys: QueueKeys, extra_keys: Sequence[str]) -> tuple[str, ...]:
    return (
        keys.ready,
        keys.delayed,
        keys.leases,
        keys.wake,
        keys.fence,
        keys.dead,
        *extra_keys,
    )


_CORRUPT: Final = "aiogroupq corrupt "


def _raise_for(exc: ResponseError) -> None:
    """Raise the typed error a script's refusal stands for, if it is one."""
    text = str(exc)
    if text.startswith(_CORRUPT):
        key, _, detail = text[len(_CORRUPT) :].partition(": ")
        raise CorruptQueueError(key, detail) from exc


ENQUEUE: Final = Script("enqueue")
CLAIM: Final = Script("claim")
FINISH: Final = Script("finish")
HEARTBEAT: Final = Script("heartbeat")
RECOVER: Final = Script("recover")
CANCEL: Final = Script("cancel")
DEAD: Final = Script("dead")
WAIT: Final = Script("wait")
IDENTITY: Final = Script("identity")
CONTROL: Final = Script("control")
META: Final = Script("meta")

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
    CONTROL,
    META,
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
    unique: bool = False  # the dedup key holds until the task ends
    priority: int | None = None  # None: the group's default, else 0
    expires_ms: int = 0  # must start within this many ms (0: no expiry)
    expire_at_ms: int = 0  # must start before this Unix ms (server clock)
    schedule: str | None = None  # enqueued only if *tick* is the schedule's newest
    tick_ms: int = 0


class GroupFullRefusal(Exception):
    """``enqueue.lua`` refused the batch: task *index* would take its group
    over its cap (the producer turns this into GroupFullError)."""

    def __init__(self, index: int, live: int, cap: int) -> None:
        super().__init__(index, live, cap)
        self.index, self.live, self.cap = index, live, cap


class GroupCorruptRefusal(Exception):
    """``enqueue.lua`` refused the batch: a key of task *index*'s group is
    damaged (the producer turns this into CorruptQueueError)."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class StaleLayoutRefusal(Exception):
    """``enqueue.lua`` refused the batch: a task does not belong in this
    partition under the layout it holds (*stored*, e.g. ``"8"`` or
    ``"8>12"``); the producer reads the layout again and routes anew."""

    def __init__(self, stored: str) -> None:
        super().__init__(stored)
        self.stored = stored


class NotReplicatedRefusal(Exception):
    """The writes were made on the primary, but fewer replicas than asked
    acknowledged them in time (the producer turns this into
    NotReplicatedError)."""

    def __init__(self, ids: list[str], acked: int) -> None:
        super().__init__(ids, acked)
        self.ids, self.acked = ids, acked


#: the id ``enqueue.lua`` answers for a task whose group moved to its new
#: partition (nothing written for it)
MOVED: Final = ">"


@dataclass(frozen=True, slots=True)
class Routing:
    """What a partitioned queue's enqueue carries (see ``enqueue.lua``):
    the partition it goes to, and each task's group hash (None: no group)."""

    partition: int
    hashes: Sequence[int | None]


@dataclass(frozen=True, slots=True)
class Replication:
    """Wait for this many replicas to acknowledge, at most *timeout_ms*."""

    replicas: int
    timeout_ms: int


async def enqueue(
    client: Client,
    keys: QueueKeys,
    tasks: Sequence[NewTask],
    *,
    dedup_window_ms: int,
    routing: Routing | None = None,
    replication: Replication | None = None,
) -> list[str]:
    """Add *tasks* in one atomic call; return each task's id (a deduplicated
    task's is the id of the task holding its key; "" for a schedule tick that
    was enqueued already; :data:`MOVED` for a task whose group moved).

    :raises GroupFullRefusal: nothing written, a group would exceed its cap
    :raises GroupCorruptRefusal: nothing written, a group's key is damaged
    :raises StaleLayoutRefusal: nothing written, a task belongs elsewhere
    :raises NotReplicatedRefusal: written on the primary, not acknowledged
        by enough replicas in time
    """
    args: list[EncodableT] = [dedup_window_ms, len(tasks)]
    for t in tasks:
        args += (
            t.id,
            t.group or "",
            t.envelope,
            t.delay_ms,
            t.run_at_ms,
            t.max_attempts,
            t.dedup_key or "",
            "1" if t.unique else "",
            "" if t.priority is None else t.priority,
            t.expires_ms,
            t.expire_at_ms,
            t.schedule or "",
            t.tick_ms,
        )
    if routing is not None:
        args.append(routing.partition)
        args += ("" if h is None else h for h in routing.hashes)
    acked = -1
    try:
        if replication is None:
            reply = await ENQUEUE(client, keys, (), args)
        else:
            reply, acked = await ENQUEUE.replicated(
                client,
                keys,
                (),
                args,
                replicas=replication.replicas,
                timeout_ms=replication.timeout_ms,
            )
    except ResponseError as exc:
        words = str(exc).split()
        if words[:2] == ["aiogroupq", "group-full"]:
            raise GroupFullRefusal(*map(int, words[2:5])) from exc
        if words[:2] == ["aiogroupq", "group-corrupt"]:
            raise GroupCorruptRefusal(int(words[2])) from exc
        if words[:2] == ["aiogroupq", "stale"]:
            raise StaleLayoutRefusal(" ".join(words[2:3])) from exc
        raise
    ids = [bytes(task_id).decode("utf-8", "replace") for task_id in reply]
    if replication is not None and acked < replication.replicas:
        raise NotReplicatedRefusal(ids, acked)
    return ids


async def meta(client: Client, keys: QueueKeys, op: str, *args: str) -> str:
    """Run a ``meta.lua`` operation on one partition; return the layout it
    answers (``"1"``: one partition)."""
    return _text(await META(client, keys, (), (op, *args)))


@dataclass(frozen=True, slots=True)
class Claimed:
    """A task the claim handed to us."""

    id: str
    envelope: bytes
    attempt: int
    token: int
    due_ms: int = 0  # when it became runnable (server ms)
    max_attempts: int = 0  # the task's, as recovery sees it (0: unknown)
    claimed_ms: int = 0  # the server's clock when it was claimed


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """What ``claim.lua`` returned."""

    tasks: list[Claimed]
    wait_ms: int  # until the next delayed task is due; -1 when there is none
    more: bool  # runnable entries are left in the ready list
    now_ms: int = 0  # the server's clock when it ran
    dead: tuple[str, ...] = ()  # tasks it dead-lettered (on_dead)
    problems: tuple[str, ...] = ()  # damaged keys it met
    expired: tuple[str, ...] = ()  # tasks it ended expired
    replicated: bool = True  # enough replicas acknowledged it (if asked)


def _texts(items: Any) -> tuple[str, ...]:
    return tuple(_text(item) for item in items)


async def claim(
    client: Client,
    keys: QueueKeys,
    consumer: str,
    *,
    k: int,
    lease_ms: int,
    scan_limit: int,
    retention_ms: int = 3_600_000,
    promote_limit: int = 1000,
    recover_limit: int = 100,
    replication: Replication | None = None,
) -> ClaimReply:
    """Recover, promote, then claim up to *k* tasks for *consumer*.

    With *replication*, the reply's ``replicated`` says whether enough
    replicas acknowledged the claim in time.
    """
    # The nonce makes a re-sent call (redis-py retrying after a lost reply)
    # return what the first one claimed instead of claiming more.
    nonce = os.urandom(8).hex()
    extra = (keys.inflight(consumer), keys.last_claim(consumer))
    args = (
        consumer,
        k,
        lease_ms,
        scan_limit,
        promote_limit,
        recover_limit,
        nonce,
        retention_ms,
    )
    replicated = True
    if replication is None:
        reply = await CLAIM(client, keys, extra, args)
    else:
        reply, acked = await CLAIM.replicated(
            client,
            keys,
            extra,
            args,
            replicas=replication.replicas,
            timeout_ms=replication.timeout_ms,
        )
        replicated = acked >= replication.replicas
    tasks = [
        Claimed(
            _text(reply[i]),
            reply[i + 1],
            int(reply[i + 2]),
            int(reply[i + 3]),
            int(reply[i + 4]),
            int(reply[i + 5]),
            int(reply[2]),
        )
        for i in range(6, len(reply), 6)
    ]
    return ClaimReply(
        tasks,
        int(reply[0]),
        reply[1] == 1,
        int(reply[2]),
        _texts(reply[3]),
        _texts(reply[4]),
        _texts(reply[5]),
        replicated,
    )


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
#: applied to the task alone: a key of its group is damaged
GROUP_DAMAGED: Final = 4
#: refused: the task's hash is damaged
TASK_DAMAGED: Final = 5


async def finish(
    client: Client, keys: QueueKeys, outcomes: Sequence[Outcome], *, retention_ms: int
) -> list[int]:
    """Apply *outcomes*; return APPLIED, APPLIED_AS_CANCEL, DUPLICATE,
    LEASE_LOST, GROUP_DAMAGED or TASK_DAMAGED for each."""
    args: list[EncodableT] = [retention_ms, len(outcomes)]
    for o in outcomes:
        args += (o.id, o.token, o.kind, o.arg1, o.arg2)
    return [int(code) for code in await FINISH(client, keys, (), args)]


async def recover(
    client: Client,
    keys: QueueKeys,
    consumer: str,
    *,
    counted: bool,
    retention_ms: int = 3_600_000,
    keep: Sequence[str] = (),
) -> tuple[int, tuple[str, ...]]:
    """Give back *consumer*'s held tasks except *keep*; return how many, and
    the ids of those dead-lettered (counted, past their last attempt)."""
    args: list[EncodableT] = [1 if counted else 0, consumer, retention_ms, *keep]
    reply = await RECOVER(client, keys, (keys.inflight(consumer),), args)
    return int(reply[0]), _texts(reply[1])


async def identity(
    client: Client,
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


async def task_state(client: Client, keys: QueueKeys, task_id: str) -> str | None:
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
    client: Client,
    keys: QueueKeys,
    leases: Sequence[tuple[str, int]],
    *,
    lease_ms: int,
    consumer: str | None = None,
    registration: Sequence[tuple[str, EncodableT]] = (),
    replication: Replication | None = None,
) -> list[int]:
    """Extend *leases* (task id, token); return ALIVE, LOST or CANCEL_REQUESTED
    for each. With *consumer*, also record it in the consumer registry with
    the *registration* fields (host, pid, in-flight count, ...).

    :raises NotReplicatedRefusal: with *replication*, when too few replicas
        acknowledged the extension in time (its ``ids`` are the codes)
    """
    args: list[EncodableT] = [lease_ms, len(leases)]
    for task_id, token in leases:
        args += (task_id, token)
    extra: tuple[str, ...] = ()
    if consumer is not None:
        extra = (keys.consumers, keys.consumer_info(consumer))
        args.append(consumer)
        for name, value in registration:
            args += (name, value)
    if replication is None:
        return [int(code) for code in await HEARTBEAT(client, keys, extra, args)]
    reply, acked = await HEARTBEAT.replicated(
        client,
        keys,
        extra,
        args,
        replicas=replication.replicas,
        timeout_ms=replication.timeout_ms,
    )
    codes = [int(code) for code in reply]
    if acked < replication.replicas:
        raise NotReplicatedRefusal([str(code) for code in codes], acked)
    return codes


NOT_FOUND: Final = 0
CANCELLED: Final = 1
REQUESTED: Final = 2
FINISHED: Final = 3


async def cancel(
    client: Client, keys: QueueKeys, task_id: str, *, retention_ms: int
) -> int:
    """Cancel *task_id*: NOT_FOUND, CANCELLED, REQUESTED (running) or FINISHED."""
    return int(await CANCEL(client, keys, (), (retention_ms, task_id)))


#: targets per ``dead.lua`` call: each call stays a few ms of Redis time
DEAD_BATCH: Final = 500


async def dead_action(
    client: Client, keys: QueueKeys, op: str, targets: Sequence[str]
) -> int:
    """``requeue``/``purge`` dead task ids or ``release`` halted groups, in
    calls of at most :data:`DEAD_BATCH`; return how many were acted on."""
    done = 0
    for start in range(0, len(targets), DEAD_BATCH):
        chunk = targets[start : start + DEAD_BATCH]
        done += int(await DEAD(client, keys, (), (op, *chunk)))
    return done


async def dead_ids(client: Client, keys: QueueKeys, limit: int) -> list[str]:
    """The oldest *limit* dead task ids."""
    ids: Any = await client.zrange(keys.dead, 0, limit - 1)
    return [bytes(task_id).decode() for task_id in ids]


async def wait_done(
    client: Client, keys: QueueKeys, task_id: str, timeout: float, block_cap: float
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


async def control(client: Client, keys: QueueKeys, op: str, *args: EncodableT) -> int:
    """Run a ``control.lua`` operation; return how many tasks became runnable."""
    return int(await CONTROL(client, keys, (), (op, *args)))
