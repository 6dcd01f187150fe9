"""Every Lua script of the package, each with the queue's fixed keys it
takes, and the wrapper that builds each call and reads its reply (the codes
and refusals are in :mod:`.replies`; how a script runs, in :mod:`.lua`).

Replies carry bytes that anything with access to Redis may have written:
what is decoded for display (ids, states, reasons) is decoded leniently and
never raises.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from redis.exceptions import ResponseError

from .keys import scoped_dedup
from .lua import Script
from .replies import (
    FINISH_CODES,
    HEARTBEAT_CODES,
    CancelCode,
    FinishCode,
    HeartbeatCode,
    NotReplicatedRefusal,
    refusal,
    text,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .connection import Client
    from .held import HeldConnection
    from .keys import QueueKeys

# The catalogue: every script of the package, with the fixed keys it takes.
ENQUEUE: Final = Script("enqueue", keys=("ready", "delayed", "wake"))
#: a lone plain task (see :func:`_plain`): what ENQUEUE does for it, lighter
ENQUEUE_ONE: Final = Script("enqueue_one", keys=("ready", "wake"))
CLAIM: Final = Script(
    "claim", keys=("ready", "delayed", "leases", "wake", "fence", "dead")
)
FINISH: Final = Script("finish", keys=("ready", "delayed", "leases", "wake", "dead"))
HEARTBEAT: Final = Script("heartbeat", keys=("leases",))
RECOVER: Final = Script(
    "recover", keys=("ready", "delayed", "leases", "wake", "fence", "dead")
)
CANCEL: Final = Script("cancel", keys=("ready", "delayed", "wake", "dead"))
#: cancel a group's tasks, a bounded number per call (``Admin.cancel_group``)
CANCEL_GROUP: Final = Script("cancel_group", keys=("ready", "delayed", "wake", "dead"))
DEAD: Final = Script("dead", keys=("ready", "delayed", "wake", "dead"))
WAIT: Final = Script("wait", keys=())
IDENTITY: Final = Script("identity", keys=())
CONTROL: Final = Script("control", keys=("ready", "delayed", "wake"))
META: Final = Script("meta", keys=("ready", "delayed", "leases", "dead"))
#: the views (``no-writes``: a replica may answer them)
STATS: Final = Script("stats", keys=("ready", "delayed", "leases", "dead", "consumers"))
GROUP_INFO: Final = Script(
    "group_info", keys=("ready", "delayed", "leases", "dead", "consumers")
)
CONSUMERS: Final = Script("consumers", keys=("consumers",))
TASK_INFO: Final = Script("task_info", keys=("delayed", "leases", "dead"))
ESTIMATE: Final = Script("estimate", keys=("ready", "delayed", "leases"))
STATUSES: Final = Script("statuses", keys=())
#: top up a running batch (``Handler(batch_wait=...)``)
BATCH_EXTEND: Final = Script(
    "batch_extend", keys=("ready", "delayed", "leases", "wake", "fence", "dead")
)
#: one step of ``aiogroupq check --repair``
REPAIR: Final = Script(
    "repair", keys=("ready", "delayed", "leases", "wake", "fence", "dead")
)

ALL_SCRIPTS: Final = (
    ENQUEUE,
    ENQUEUE_ONE,
    CLAIM,
    FINISH,
    HEARTBEAT,
    RECOVER,
    CANCEL,
    CANCEL_GROUP,
    DEAD,
    WAIT,
    IDENTITY,
    CONTROL,
    META,
    STATS,
    GROUP_INFO,
    CONSUMERS,
    TASK_INFO,
    ESTIMATE,
    STATUSES,
    REPAIR,
    BATCH_EXTEND,
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
    #: what the task keeps once ended (``codec.identity``); "": nothing
    identity: str = ""
    #: the dedup key holds among the tasks of *group* only (``keys.scoped_dedup``)
    dedup_in_group: bool = False


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
    held: HeldConnection | None = None,
) -> list[str]:
    """Add *tasks* in one atomic call; return each task's id (a deduplicated
    task's is the id of the task holding its key; "" for a schedule tick that
    was enqueued already; :data:`~.replies.MOVED` for a task whose group
    moved). Sent on *held* (a producer's connection, ``held.py``) when given
    and no replication is waited for.

    :raises GroupFullRefusal: nothing written, a group would exceed its cap
    :raises GroupCorruptRefusal: nothing written, a group's key is damaged
    :raises StaleLayoutRefusal: nothing written, a task belongs elsewhere
    :raises NotReplicatedRefusal: written on the primary, not acknowledged
        by enough replicas in time
    """
    script, args = (
        (ENQUEUE_ONE, _one_args(tasks[0]))
        if routing is None and len(tasks) == 1 and _plain(tasks[0])
        else (ENQUEUE, _enqueue_args(tasks, dedup_window_ms, routing))
    )
    acked = -1
    try:
        if replication is None and held is not None:
            reply = await script.held(held, keys, (), args)
        elif replication is None:
            reply = await script(client, keys, (), args)
        else:
            reply, acked = await script.replicated(
                client,
                keys,
                (),
                args,
                replicas=replication.replicas,
                timeout_ms=replication.timeout_ms,
            )
    except ResponseError as exc:
        if (refused := refusal(exc)) is not None:
            raise refused from exc
        raise
    if script is ENQUEUE_ONE:
        reply = [reply]
    ids = [bytes(task_id).decode("utf-8", "replace") for task_id in reply]
    if replication is not None and acked < replication.replicas:
        raise NotReplicatedRefusal(ids, acked)
    return ids


def _plain(task: NewTask) -> bool:
    """Whether ``enqueue_one.lua`` carries *task*: nothing it leaves out (a
    group, a due time, a dedup key, a schedule, a priority) is asked for.
    A lone ``enqueue()`` is most often such a task, and the full script's
    helpers and plan cost the server a third of such a call's time."""
    return (
        task.group is None
        and task.delay_ms == 0
        and task.run_at_ms == 0
        and task.dedup_key is None
        and not task.unique
        and not task.priority  # 0 or the default: 0 without a group
        and task.schedule is None
    )


def _one_args(task: NewTask) -> list[EncodableT]:
    return [
        task.id.encode(),
        task.envelope,
        b"%d" % task.max_attempts,
        b"%d" % task.expires_ms,
        b"%d" % task.expire_at_ms,
        task.identity.encode(),
    ]


def _enqueue_args(
    tasks: Sequence[NewTask], dedup_window_ms: int, routing: Routing | None
) -> list[EncodableT]:
    # Every value as bytes already: redis-py then passes each through as it
    # is instead of testing its type and converting it (14 per task).
    args: list[EncodableT] = [b"%d" % dedup_window_ms, b"%d" % len(tasks)]
    for t in tasks:
        args += (
            t.id.encode(),
            b"" if t.group is None else t.group.encode(),
            t.envelope,
            b"%d" % t.delay_ms,
            b"%d" % t.run_at_ms,
            b"%d" % t.max_attempts,
            _dedup_arg(t),
            b"1" if t.unique else b"",
            b"" if t.priority is None else b"%d" % t.priority,
            b"%d" % t.expires_ms,
            b"%d" % t.expire_at_ms,
            b"" if t.schedule is None else t.schedule.encode(),
            b"%d" % t.tick_ms,
            t.identity.encode(),
        )
    if routing is not None:
        args.append(routing.partition)
        args += ("" if h is None else h for h in routing.hashes)
    return args


def _dedup_arg(task: NewTask) -> EncodableT:
    if task.dedup_key is None:
        return b""
    if task.dedup_in_group and task.group is not None:
        return scoped_dedup(task.group, task.dedup_key)
    return task.dedup_key.encode()


async def meta(client: Client, keys: QueueKeys, op: str, *args: str) -> str:
    """Run a ``meta.lua`` operation on one partition; return the layout it
    answers (``"1"``: one partition)."""
    return text(await META(client, keys, (), (op, *args)))


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
    member: bool = False  # of the batch of the task claimed before it
    alone: bool = False  # heads a recovered batch: runs alone (bx)


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
    reasons: tuple[str, ...] = ()  # each dead-lettered task's reason
    #: the error of the blocking pop sent in front of the claim (``pop``), if
    #: it failed while the claim ran (a damaged wake list refuses the claim)
    pop_error: Exception | None = None


def _texts(items: Any) -> tuple[str, ...]:
    return tuple(text(item) for item in items)


def _dead(items: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ids and the reasons of an ``id, reason, ...`` reply."""
    texts = _texts(items)
    return texts[0::2], texts[1::2]


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
    batches: Sequence[tuple[str, int]] = (),
    pop: float | None = None,
) -> ClaimReply:
    """Recover, promote, then claim up to *k* tasks for *consumer*.

    With *replication*, the reply's ``replicated`` says whether enough
    replicas acknowledged the claim in time. *batches*: the task types of
    batch handlers and their sizes; each such task claimed with a group
    brings the members of its batch (``Claimed.member``) right after it.
    With *pop* (seconds; a plain client, no *replication*), the claim is
    written right behind a ``BLPOP`` of the wake list that long (see
    :meth:`~.lua.Script.behind`): it runs the moment a wake token, or the
    timeout, ends the pop.
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
        *_batch_args(batches),
    )
    popped: Any = None
    if pop is None:
        reply, replicated = await _taking(CLAIM, client, keys, extra, args, replication)
    else:
        assert replication is None
        first = ("BLPOP", keys.wake, pop)
        popped, reply = await CLAIM.behind(client, keys, extra, args, first=first)
        replicated = True
    stride = 7 if batches else 6
    tasks = [
        _claimed(reply, i, int(reply[2]), reply[i + 6] if batches else 0)
        for i in range(6, len(reply), stride)
    ]
    dead, reasons = _dead(reply[3])
    return ClaimReply(
        tasks,
        int(reply[0]),
        reply[1] == 1,
        int(reply[2]),
        dead,
        _texts(reply[4]),
        _texts(reply[5]),
        replicated,
        reasons,
        popped if isinstance(popped, Exception) else None,
    )


def _claimed(reply: Any, i: int, claimed_ms: int, batch: int) -> Claimed:
    """The task at *i* of a claim's (or a top-up's) reply: id, envelope,
    attempt, token, due time, max attempts; *batch* as claim.lua's 7th
    value (1: a member, 2: a recovered batch's head)."""
    return Claimed(
        text(reply[i]),
        reply[i + 1],
        int(reply[i + 2]),
        int(reply[i + 3]),
        int(reply[i + 4]),
        int(reply[i + 5]),
        claimed_ms,
        member=batch == 1,
        alone=batch == 2,
    )


async def _taking(
    script: Script,
    client: Client,
    keys: QueueKeys,
    extra: Sequence[str],
    args: Sequence[EncodableT],
    replication: Replication | None,
) -> tuple[Any, bool]:
    """A script call that starts tasks, and whether enough replicas
    acknowledged it (always, without *replication*)."""
    if replication is None:
        return await script(client, keys, extra, args), True
    reply, acked = await script.replicated(
        client,
        keys,
        extra,
        args,
        replicas=replication.replicas,
        timeout_ms=replication.timeout_ms,
    )
    return reply, acked >= replication.replicas


def _batch_args(batches: Sequence[tuple[str, int]]) -> tuple[EncodableT, ...]:
    """Claim's ARGV from 10 on: nothing without batch handlers."""
    if not batches:
        return ()
    return (len(batches), *(v for pair in batches for v in pair))


async def batch_extend(
    client: Client,
    keys: QueueKeys,
    consumer: str,
    head: Claimed,
    task_type: str,
    *,
    most: int,
    lease_ms: int,
    replication: Replication | None = None,
) -> ClaimReply:
    """Top up *head*'s running batch with up to *most* tasks of its group's
    line; return them (members, in order) as a claim's reply (``tasks``
    and ``replicated`` only)."""
    extra = (keys.inflight(consumer),)
    args = (head.id, head.token, consumer, task_type, most, lease_ms)
    reply, replicated = await _taking(
        BATCH_EXTEND, client, keys, extra, args, replication
    )
    # A top-up's reply has no clock of its own: a member's due time is the
    # moment the top-up took it (lib/batch.lua), its claim time too.
    tasks = [_claimed(reply, i, int(reply[i + 4]), 1) for i in range(0, len(reply), 6)]
    return ClaimReply(tasks, -1, False, replicated=replicated)


#: what ``finish.lua`` does with an attempt: succeeded, retry after a
#: delay, dead-letter (``halt``: and halt its group), cancelled, handed back
#: uncounted (``back``: to the front of its group; ``line``: a batch member
#: not run, behind its head)
OutcomeKind = Literal["ok", "retry", "dead", "halt", "cancel", "back", "line"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's result for ``finish.lua``."""

    id: str
    token: int
    kind: OutcomeKind
    arg1: str | int | bytes = ""
    arg2: str = ""


async def finish(
    client: Client, keys: QueueKeys, outcomes: Sequence[Outcome], *, retention_ms: int
) -> list[FinishCode]:
    """Apply *outcomes*; return what became of each."""
    args: list[EncodableT] = [retention_ms, len(outcomes)]
    for o in outcomes:
        args += (o.id, o.token, o.kind, o.arg1, o.arg2)
    return [FINISH_CODES[int(code)] for code in await FINISH(client, keys, (), args)]


@dataclass(frozen=True, slots=True)
class Recovered:
    """What ``recover.lua`` returned."""

    given_back: int
    dead: tuple[str, ...]  # ids dead-lettered (counted, past their last attempt)
    reasons: tuple[str, ...]  # their reasons


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
    done = await recover_reasons(
        client, keys, consumer, counted=counted, retention_ms=retention_ms, keep=keep
    )
    return done.given_back, done.dead


async def recover_reasons(
    client: Client,
    keys: QueueKeys,
    consumer: str,
    *,
    counted: bool,
    retention_ms: int = 3_600_000,
    keep: Sequence[str] = (),
) -> Recovered:
    """:func:`recover`, with the reasons of the tasks it dead-lettered."""
    args: list[EncodableT] = [1 if counted else 0, consumer, retention_ms, *keep]
    reply = await RECOVER(client, keys, (keys.inflight(consumer),), args)
    dead, reasons = _dead(reply[1])
    return Recovered(int(reply[0]), dead, reasons)


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


async def heartbeat(
    client: Client,
    keys: QueueKeys,
    leases: Sequence[tuple[str, int]],
    *,
    lease_ms: int,
    consumer: str | None = None,
    registration: Sequence[tuple[str, EncodableT]] = (),
    replication: Replication | None = None,
    restore: bool = False,
) -> list[HeartbeatCode]:
    """Extend *leases* (task id, token); return what became of each. With
    *consumer*, also record it in the consumer registry with the
    *registration* fields (host, pid, in-flight count, ...). With *restore*,
    a lease whose token still owns its running task is set again even if it
    expired or is gone (after the leases key was damaged and repaired).

    :raises NotReplicatedRefusal: with *replication*, when too few replicas
        acknowledged the extension in time (its ``ids`` are the codes)
    """
    args: list[EncodableT] = [lease_ms, "1" if restore else "", len(leases)]
    for task_id, token in leases:
        args += (task_id, token)
    extra: tuple[str, ...] = ()
    if consumer is not None:
        extra = (keys.consumers, keys.consumer_info(consumer))
        args.append(consumer)
        for name, value in registration:
            args += (name, value)
    if replication is None:
        reply = await HEARTBEAT(client, keys, extra, args)
        return [HEARTBEAT_CODES[int(code)] for code in reply]
    reply, acked = await HEARTBEAT.replicated(
        client,
        keys,
        extra,
        args,
        replicas=replication.replicas,
        timeout_ms=replication.timeout_ms,
    )
    codes = [HEARTBEAT_CODES[int(code)] for code in reply]
    if acked < replication.replicas:
        raise NotReplicatedRefusal([str(int(c)) for c in codes], acked)
    return codes


async def cancel(
    client: Client, keys: QueueKeys, task_id: str, *, retention_ms: int
) -> CancelCode:
    """Cancel *task_id*, wherever it waits (or ask its consumer to)."""
    return CancelCode(int(await CANCEL(client, keys, (), (retention_ms, task_id))))


#: most tasks one ``cancel_group.lua`` call looks at: about 6 ms of Redis
#: time (12 ms for 1,000 on a 2-core machine), as a dead-letter batch
CANCEL_GROUP_BATCH: Final = 500


@dataclass(frozen=True, slots=True)
class GroupCancelled:
    """What one ``cancel_group.lua`` call did, and the group's counts after."""

    cancelled: int
    asked: int  # running tasks whose consumers were asked to cancel them
    looked: int  # line entries read ("line")
    kept: int  # of those, the ones left in the line (not the group's)
    holders: int  # the group's k: slot holders
    delayed: int  # its d: tasks in their first delay
    line: int  # its w: tasks in its line


async def cancel_group(
    client: Client,
    keys: QueueKeys,
    group: str,
    *,
    line: tuple[int, int] | None = None,
    ids: Sequence[str] = (),
    first: bool = False,
    running: bool,
    retention_ms: int,
) -> GroupCancelled:
    """Cancel tasks of *group*, each only if it is a queued or delayed task
    of the group: with *line* ``(skip, count)``, those of its line from
    position *skip*, at most *count*; else *ids* (at most
    :data:`CANCEL_GROUP_BATCH`), with *first* only those in their first
    delay (no slot holder). With *running*, also ask the consumers of those
    that run to cancel them."""
    args: list[EncodableT] = [retention_ms, group, "1" if running else ""]
    if line is not None:
        args += ("line", *line)
    else:
        args += ("first" if first else "ids", *ids)
    reply = await CANCEL_GROUP(client, keys, (), args)
    return GroupCancelled(*(int(n) for n in reply))


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


async def dead_previews(
    client: Client, keys: QueueKeys, task_ids: Sequence[str], most: int
) -> list[bytes | None]:
    """The first *most* bytes of each task's envelope (None: no envelope),
    in calls of at most :data:`DEAD_BATCH` ids (``dead.lua``'s
    ``preview``)."""
    out: list[bytes | None] = []
    for start in range(0, len(task_ids), DEAD_BATCH):
        chunk = task_ids[start : start + DEAD_BATCH]
        reply = await DEAD(client, keys, (), ("preview", most, *chunk))
        out += [bytes(head) if head else None for head in reply]
    return out


async def wait_done(
    client: Client, keys: QueueKeys, task_id: str, timeout: float, block_cap: float
) -> tuple[str | None, bytes | None, str]:
    """Wait up to *timeout* s for *task_id* to end; return (state, result, reason).

    ``wait.lua`` marks the task so that its end pushes a token on
    ``done:<id>``; we block on that list instead of polling, and put the token
    back so that other waiters wake too. *block_cap* keeps each blocking pop
    under the client's socket timeout.
    """
    done, task = keys.done(task_id), (keys.task(task_id),)
    deadline = time.monotonic() + timeout
    while True:
        row: Any = await WAIT(client, keys, task, ())
        if not row:
            return None, None, ""
        state = text(row[0])
        if state not in ("queued", "delayed", "running"):
            reason = text(row[2]) if row[2] else ""
            return state, row[1] or None, reason
        left = deadline - time.monotonic()
        if left <= 0:
            return state, None, ""
        if await client.blpop([done], timeout=min(left, block_cap)) is not None:
            row = await WAIT(client, keys, task, ())
            if row and text(row[0]) not in ("queued", "delayed", "running"):
                await client.rpush(done, "1")  # for the other waiters
            # else a stale token (a dead letter requeued since): dropped


async def estimate_facts(
    client: Client, keys: QueueKeys, task_id: str, *, bound: int, window: int
) -> Any:
    """What ``estimate.lua`` reads for *task_id* ("" for the start counter
    alone), as it returns it (``_inspect/estimate.py`` reads the reply)."""
    return await ESTIMATE(client, keys, (), (task_id, bound, window))


async def control(client: Client, keys: QueueKeys, op: str, *args: EncodableT) -> int:
    """Run a ``control.lua`` operation; return how many tasks became runnable."""
    return int(await CONTROL(client, keys, (), (op, *args)))
