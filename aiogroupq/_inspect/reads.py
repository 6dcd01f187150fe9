"""Reading a queue's views: each is one read-only script call
(``stats.lua``, ``group_info.lua``, ``task_info.lua``, flagged
``no-writes``, so a replica can answer too) that reads indexes and counters
the other scripts keep, never a scan of the queue's keys. The scripts return
raw facts; this module turns them into the dataclasses of
``_inspect/views.py``. The consumer registry is read in
``_inspect/consumers.py``, and the sentence that says why a group or a task
is (not) running is worked out in ``_inspect/reasons.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
from redis.exceptions import NoScriptError, ResponseError

from .._store import functions as _functions
from .._store.codec import unpack
from .._store.fanout import each_partition
from .._store.lua import library
from .._store.replies import NOT_A_TASK, text as _text
from .._store.schema import TOTALS
from .._store.scripts import GROUP_INFO, STATS, STATUSES, TASK_INFO
from ..errors import CorruptTaskError
from ..task import DeadLetter, TaskState
from .consumers import Beat, Liveness, consumer_from_row, discount_gone, registry_beats
from .raw import (
    as_int as _int,
    opt_int as _opt_int,
    opt_text as _opt_text,
    pairs as _pairs,
    secs as _secs,
)
from .reasons import group_reason, task_reason
from .views import (
    GroupInfo,
    GroupPage,
    GroupSort,
    GroupState,
    GroupTask,
    QueueStats,
    Slot,
    TaskDetails,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from .._store.lua import Script
    from .._store.partition import Partitions

#: live consumers listed in :attr:`QueueStats.consumers`
STATS_CONSUMERS: Final = 100
#: task ids per ``statuses.lua`` call (a millisecond or two of server time)
STATUS_CHUNK: Final = 500


# -- stats ---------------------------------------------------------------------


async def queue_stats(client: Client, keys: QueueKeys) -> QueueStats:
    """The queue's counts (one ``stats.lua`` call)."""
    r = await STATS(client, keys, (), (STATS_CONSUMERS,))
    now_ms = _int(r[0])
    counters = {k: _int(v) for k, v in _pairs(r[17]).items()}
    ratewait = counters.get("ratewait", 0)
    # A pause or a halt leaves a group's tasks where they were: its heads in
    # the ready list (until a claim sets them aside), its line parked. They
    # are held back all the same, and counted so.
    held_lines, held_heads = _int(r[19][0]), _int(r[19][1])
    parked = counters.get("parked", 0)
    heads = [_int(v) for v in (r[13], r[14], r[15]) if v is not None]
    next_due = None if r[16] is None else max(0, _int(r[16]) - now_ms) / 1000
    return QueueStats(
        queue=keys.queue,
        exists=r[1] == 1,
        now=now_ms / 1000,
        paused=r[2] == 1,
        ready=max(0, _int(r[3]) + _int(r[4]) - held_heads),
        parked=max(0, parked - held_lines),
        held=counters.get("held", 0) + held_lines + held_heads,
        delayed=max(0, _int(r[5]) - ratewait),
        running=_int(r[6]),
        dead=_int(r[7]),
        groups=counters.get("groups", 0),
        groups_waiting=_int(r[8]),
        groups_halted=_int(r[9]),
        groups_paused=_int(r[10]),
        groups_rate_limited=ratewait,
        consumers_alive=_int(r[11]),
        consumers_gone=_int(r[12]),
        consumers=tuple(consumer_from_row(row, now_ms) for row in r[18]),
        oldest_waiting=max(0, now_ms - min(heads)) / 1000 if heads else None,
        next_due_in=next_due,
        totals={name: counters.get(name, 0) for name in TOTALS},
    )


# -- groups --------------------------------------------------------------------

_SLOTS: Final[dict[str, Slot]] = {"@": "ready", "r": "retry", "~": "held"}


async def group_infos(
    client: Client, keys: QueueKeys, groups: Sequence[str], *, alive: int | None = None
) -> list[GroupInfo]:
    """These groups as seen now (one ``group_info.lua`` call). *alive*: the
    live consumers, when the registry is in another partition than *keys*
    (each partition's own is empty). The consumers of running tasks are
    looked up in the registry (one more round trip, when a task runs)."""
    reply = await GROUP_INFO(client, keys, (), ("groups", *groups))
    return (await _described(client, keys, reply, alive))[0]


async def group_page(
    client: Client,
    keys: QueueKeys,
    sort: GroupSort,
    cursor: int,
    limit: int,
    *,
    alive: int | None = None,
) -> GroupPage:
    """One page of groups (one ``group_info.lua`` call, as group_infos)."""
    reply = await GROUP_INFO(client, keys, (), (sort, cursor, limit))
    infos, next_cursor = await _described(client, keys, reply, alive)
    return GroupPage(tuple(infos), next_cursor)


async def _described(
    client: Client, keys: QueueKeys, reply: Sequence[Any], alive: int | None
) -> tuple[list[GroupInfo], int | None]:
    now_ms, queue_paused = _int(reply[0]), reply[1] == 1
    if alive is None:
        alive = _int(reply[2])
    cursor = _int(reply[3], -1)
    rows = reply[4:]
    # The registry's entries of the running tasks' consumers, with their
    # hosts and pids: whether each process still runs is told here. (The
    # script reads this partition's registry, empty but in partition 0, and
    # not the hosts and pids.)
    beats, _ = await registry_beats(
        client,
        keys,
        (
            _text(h[5])
            for row in rows
            if len(row) > 2
            for h in row[16]
            if _text(h[1]) not in _SLOTS and h[5]
        ),
    )
    known = {name: (b, b.liveness(now_ms)) for name, b in beats.items()}
    alive = discount_gone(alive, known.values())
    infos = [_group(row, now_ms, queue_paused, alive, known) for row in rows]
    return infos, None if cursor < 0 else cursor


def _holder(
    h: Sequence[Any],
    now_ms: int,
    rate_free_at: float | None,
    known: dict[str, tuple[Beat, Liveness]],
) -> GroupTask:
    tid, mark, _, attempt, max_attempts, consumer, dt, lease, due, _, _ = h
    slot = _SLOTS.get(_text(mark), "running")
    if slot == "running":
        due_at = None
    elif slot == "retry":
        due_at = _secs(due)
    elif slot == "held" and rate_free_at is not None:
        due_at = rate_free_at
    else:
        due_at = _secs(dt)
    name = _opt_text(consumer) if slot == "running" else None
    alive: bool | None = None
    beat: float | None = None
    liveness: Liveness | None = None
    if name is not None:
        entry, liveness = known.get(name) or (Beat(), Beat().liveness(now_ms))
        alive = liveness.state != "gone"
        beat = None if entry.heartbeat is None else entry.heartbeat / 1000
    return GroupTask(
        _text(tid),
        slot,
        _int(attempt),
        _int(max_attempts, 1),
        name,
        _secs(lease) if slot == "running" else None,
        due_at,
        consumer_alive=alive,
        consumer_heartbeat=beat,
        consumer_state=None if liveness is None else liveness.state,
        consumer_status=None if liveness is None else liveness.status,
    )


def _group(
    row: Sequence[Any],
    now_ms: int,
    queue_paused: bool,
    alive: int,
    known: dict[str, tuple[Beat, Liveness]],
) -> GroupInfo:
    now = now_ms / 1000
    name = _text(row[0])
    if len(row) < 3:  # a damaged group key
        return GroupInfo(
            name, GroupState.DAMAGED,
            f"a key of group {name!r} is damaged: run 'aiogroupq check'",
            0, 0, 0, 0, (), None, None, None, None, None, False, queue_paused,
            None, None, None, False, alive, now,
        )  # fmt: skip
    k, d, w = _int(row[1]), _int(row[2]), _int(row[3])
    limit, rn, rp, mx = _int(row[5], 1), _int(row[7]), _int(row[8]), _int(row[9])
    rate_free_at = _secs(row[10])
    holders = [_holder(h, now_ms, rate_free_at, known) for h in row[16]]
    holders.sort(key=lambda t: (t.slot != "running", t.due_at or 0.0, t.id))
    running, ready, retry, held = (_int(n) for n in row[17])
    line_head = _opt_text(row[12])
    waiting_dts = [_int(h[6]) for h in row[16] if _text(h[1]) in _SLOTS and h[6]]
    head = next((h for h in holders if h.slot != "running"), None)
    if line_head is not None:
        dt, attempt, max_attempts = row[13] or (None, None, None)
        if dt is not None:
            waiting_dts.append(_int(dt))
        if head is None:
            head = GroupTask(line_head, "line", _int(attempt), _int(max_attempts, 1))
    first_due, horizon = (
        (_secs(row[18]), _secs(row[19])) if len(row) > 19 else (None, None)
    )
    info = GroupInfo(
        group=name,
        state=GroupState.IDLE,
        reason="",
        running=running,
        backlog=w,
        delayed=d,
        concurrency=limit,
        holders=tuple(holders),
        head=head,
        oldest_age=max(0, now_ms - min(waiting_dts)) / 1000 if waiting_dts else None,
        waiting_since=_secs(row[11]),
        halted_by=_opt_text(row[4]),
        halted_reason=_opt_text(row[15]),
        paused=row[6] == 1,
        queue_paused=queue_paused,
        rate=(rn, rp / 1000) if rn and rp else None,
        rate_free_at=rate_free_at,
        max_size=mx or None,
        full=bool(mx) and k + d + w >= mx,
        consumers_alive=alive,
        now=now,
        next_due_at=first_due,
        weight=_int(row[20], 1) if len(row) > 20 else 1,
        ordering="exclusive"
        if len(row) > 21 and _opt_text(row[21]) == "exclusive"
        else "strict",
    )
    state, reason = group_reason(
        info, ready=ready, retry=retry, held=held, horizon=horizon
    )
    return _replace(info, state, reason)


def _replace(info: GroupInfo, state: GroupState, reason: str) -> GroupInfo:
    fields = {name: getattr(info, name) for name in GroupInfo.__slots__}
    fields.update(state=state, reason=reason)
    return GroupInfo(**fields)


# -- tasks ---------------------------------------------------------------------


async def task_details(
    client: Client, keys: QueueKeys, task_id: str
) -> TaskDetails | None:
    """One task as seen now, ``None`` if there is no such task. For a live
    task the consumer registry is read too (its consumer, or whether any
    consumer is alive): one more round trip."""
    reply = await TASK_INFO(client, keys, (), (task_id,))
    if not reply:
        return None
    now_ms, raw, lease, due, _, pttl, mark, ahead, queue_paused, facts = reply
    f = _pairs(raw)
    state = _task_state(task_id, f)
    task_type, enqueued_at, payload_size, payload = _contents(f)
    slot = _task_slot(mark, ahead)
    consumer = _opt_text(f.get("c"))
    alive, liveness, heartbeat = await _liveness(
        client, keys, state, consumer, _int(now_ms)
    )
    group_paused, halted_by, rate_free_at = _group_facts(facts)
    ended = state not in (TaskState.QUEUED, TaskState.DELAYED, TaskState.RUNNING)
    blocked = queue_paused == 1 or group_paused or halted_by is not None
    details = TaskDetails(
        id=task_id,
        state=state,
        type=task_type,
        group=_opt_text(f.get("g")),
        priority=_int(f.get("p")),
        attempt=_int(f.get("a")),
        max_attempts=_int(f.get("m"), 1),
        consumer=consumer,
        lease_deadline=_secs(lease) if state == TaskState.RUNNING else None,
        due_at=rate_free_at if slot == "held" and not blocked else _secs(due),
        runnable_since=None if state == TaskState.DELAYED else _secs(f.get("dt")),
        enqueued_at=enqueued_at,
        ended_at=_secs(f.get("ft")),
        expires_at=_secs(f.get("xp")),
        error=_opt_text(f.get("x")),
        traceback=_opt_text(f.get("tb")) or None,
        cancel_requested=f.get("cx") is not None,
        slot=slot,
        position=None if ahead is None else _int(ahead),
        payload=payload,
        has_result=f.get("r") is not None,
        kept_for=_int(pttl) / 1000 if ended and _int(pttl) > 0 else None,
        now=_int(now_ms) / 1000,
        payload_size=payload_size,
        consumer_alive=None if liveness is None else liveness.state != "gone",
        consumer_heartbeat=heartbeat,
        consumer_state=None if liveness is None else liveness.state,
        consumer_status=None if liveness is None else liveness.status,
    )
    reason = task_reason(
        details,
        queue_paused=queue_paused == 1,
        group_paused=group_paused,
        halted_by=halted_by,
        alive=alive,
    )
    return dataclasses.replace(details, reason=reason)


def _task_state(task_id: str, f: dict[str, Any]) -> TaskState:
    """The task hash's state.

    :raises CorruptTaskError: for a stored state that is not a TaskState
    """
    state_text = _text(f.get("s") or b"")
    try:
        return TaskState(state_text)
    except ValueError:
        raise CorruptTaskError(task_id, f"unknown state {state_text!r}") from None


def _contents(
    f: dict[str, Any],
) -> tuple[str | None, float | None, int | None, Any]:
    """The task's type, enqueue time, payload size and payload (``None``
    each where unknown)."""
    # An ended task keeps these in one small field (lib/ends.lua); a live
    # one or a dead letter has its envelope.
    task_type, enqueued_at, payload_size = _identity(f.get("i"))
    payload = None
    if f.get("e") is not None:
        try:
            envelope = unpack(bytes(f["e"]))
            task_type, enqueued_at = envelope.type, envelope.enqueued_ms / 1000 or None
            payload_size = len(envelope.payload)
            payload = msgspec.msgpack.decode(envelope.payload)
        except Exception:  # noqa: BLE001, S110 - any stored bytes: shown as unknown
            pass
    return task_type, enqueued_at, payload_size, payload


def _identity(value: Any) -> tuple[str | None, float | None, int | None]:
    """An ended task's ``i`` field: its type, enqueue time and payload size."""
    if value is None:
        return None, None, None
    enqueued, size, task_type = [*_text(value).split(" ", 2), "", ""][:3]
    return task_type or None, _secs(enqueued or None), _opt_int(size or None)


def _task_slot(mark: Any, ahead: Any) -> Slot | None:
    """The slot the task holds in its group, ``"line"`` if it waits in the
    group's line, ``None`` if neither."""
    if mark is not None:
        return _SLOTS.get(_text(mark), "running")
    if ahead is not None:
        return "line"
    return None


async def _liveness(
    client: Client,
    keys: QueueKeys,
    state: TaskState,
    consumer: str | None,
    now_ms: int,
) -> tuple[int | None, Liveness | None, float | None]:
    """For a live task: how many consumers are alive and, for a running one,
    what is known of its consumer and its latest heartbeat (one registry
    read); ``None`` each otherwise."""
    alive: int | None = None
    liveness: Liveness | None = None
    heartbeat: float | None = None
    if state in (TaskState.QUEUED, TaskState.RUNNING):
        running = consumer if state == TaskState.RUNNING else None
        beats, alive = await registry_beats(
            client, keys, [running] if running else [], now_ms=now_ms
        )
        if running is not None:
            beat = beats.get(running, Beat())
            liveness = beat.liveness(now_ms)
            alive = discount_gone(alive or 0, [(beat, liveness)])
            heartbeat = None if beat.heartbeat is None else beat.heartbeat / 1000
    return alive, liveness, heartbeat


def _group_facts(facts: Sequence[Any] | None) -> tuple[bool, str | None, float | None]:
    """Whether the task's group is paused, the dead task it is halted behind
    and when its rate frees a start: not paused, ``None``, ``None`` for an
    ungrouped task."""
    if not facts:
        return False, None, None
    return facts[0] == 1, _opt_text(facts[1]), _secs(facts[2])


# -- dead letters without their payloads ----------------------------------------


async def dead_letters_brief(
    client: Client, parts: Partitions, limit: int
) -> list[DeadLetter]:
    """The oldest *limit* dead letters over every partition, without their
    payloads (``None``) and tracebacks (``""``): each is read with an
    ``HMGET`` of its small fields (type from the ``i`` field written at
    enqueue, group, reason, attempts), never its envelope, so a listing
    costs a few hundred bytes a letter however large the payloads are.
    A letter enqueued before ``i`` existed has its envelope read for its
    type."""

    async def rows(keys: QueueKeys) -> list[DeadLetter]:
        return await _brief_rows(client, keys, limit)

    merged = [d for part in await each_partition(parts.all(), rows) for d in part]
    merged.sort(key=lambda d: (d.dead_at, d.id))
    return merged[:limit]


async def _brief_rows(client: Client, keys: QueueKeys, limit: int) -> list[DeadLetter]:
    entries: Any = await client.zrange(keys.dead, 0, limit - 1, withscores=True)
    # The key of a stored id exactly as stored, even if it is not UTF-8.
    task_keys = [
        keys.task(bytes(task_id).decode(errors="surrogateescape")).encode(
            errors="surrogateescape"
        )
        for task_id, _ in entries
    ]
    async with client.pipeline(transaction=False) as pipe:
        for key in task_keys:
            pipe.hmget(key, "s", "i", "g", "x", "a")
        rows: list[list[Any]] = await pipe.execute()
    out: list[DeadLetter] = []
    legacy: list[tuple[int, bytes]] = []
    for key, (task_id, score), (state, ident, group, reason, attempts) in zip(
        task_keys, entries, rows, strict=True
    ):
        if state is None:  # purged between the two reads
            continue
        task_type = _identity(ident)[0]
        if ident is None:
            legacy.append((len(out), key))
        out.append(
            DeadLetter(
                id=_text(task_id),
                type=task_type or "?",
                group=_opt_text(group),
                payload=None,
                reason=_text(reason or b""),
                traceback="",
                attempts=_int(attempts),
                dead_at=float(score) / 1000,
            )
        )
    if legacy:
        await _legacy_types(client, out, legacy)
    return out


async def _legacy_types(
    client: Client, letters: list[DeadLetter], which: list[tuple[int, bytes]]
) -> None:
    """Fill in the type and group of the letters at *which* (their places
    and keys) from their envelopes: tasks enqueued before the ``i`` field
    was written."""
    async with client.pipeline(transaction=False) as pipe:
        for _, key in which:
            pipe.hget(key, "e")
        envelopes: list[Any] = await pipe.execute()
    for (i, _), raw in zip(which, envelopes, strict=True):
        try:
            envelope = unpack(bytes(raw))
        except Exception:  # noqa: BLE001, S112 - any stored bytes: left as "?"
            continue
        letters[i] = dataclasses.replace(
            letters[i], type=envelope.type, group=envelope.group
        )


def id_list(task_ids: object) -> Sequence[object]:
    """*task_ids* if it is a sequence of ids (a lone ``str`` is refused rather
    than read as a sequence of one-letter ids).

    :raises TypeError: for anything else
    """
    if isinstance(task_ids, str | bytes) or not isinstance(task_ids, Sequence):
        raise TypeError(f"expected a sequence of task ids, got {task_ids!r}")
    return task_ids


async def statuses(
    client: Client, keys: QueueKeys, task_ids: Sequence[str]
) -> list[TaskState | None]:
    """The state of each task (``None`` for an unknown id): one
    ``statuses.lua`` call per :data:`STATUS_CHUNK` ids, all in one pipeline,
    so one round trip however many ids, and no call holds the server long.

    :raises CorruptTaskError: for a stored state that is not a TaskState
    """
    chunks = [
        task_ids[start : start + STATUS_CHUNK]
        for start in range(0, len(task_ids), STATUS_CHUNK)
    ]
    calls = [([keys.task(task_id) for task_id in chunk], ()) for chunk in chunks]
    replies = await _pipelined(client, keys, STATUSES, calls)
    out: list[TaskState | None] = []
    for chunk, reply in zip(chunks, replies, strict=True):
        for task_id, raw in zip(chunk, reply, strict=True):
            if raw is None:
                out.append(None)
                continue
            text = _text(raw)
            try:
                out.append(TaskState(text))
            except ValueError:
                detail = (
                    "not a task hash"
                    if text == NOT_A_TASK
                    else f"unknown state {text!r}"
                )
                raise CorruptTaskError(task_id, detail) from None
    return out


async def _pipelined(
    client: Client,
    keys: QueueKeys,
    script: Script,
    calls: Sequence[tuple[Sequence[str], Sequence[EncodableT]]],
) -> list[Any]:
    """Run *script* once per (extra keys, arguments) call, all in one
    pipeline (of FCALL or EVALSHA, as :class:`Script` would send them).

    A ``NOSCRIPT`` answer (a flushed cache) loads the script, a function
    missing the library, and the pipeline is sent again (the script only
    reads); if the cache is flushed again in between, each call goes
    through :class:`Script`, which falls back to EVAL.
    """
    for _ in range(2):
        fcall = await _functions.way(client, library())
        async with client.pipeline(transaction=False) as pipe:
            for extra_keys, args in calls:
                # Not pipe.evalsha: a cluster pipeline refuses that method.
                command = script.command(keys, extra_keys, args, fcall=fcall)
                pipe.execute_command(*command)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        failed = next((r for r in replies if isinstance(r, ResponseError)), None)
        if fcall and await _functions.recover(client, failed, library(), script.name):
            continue
        if not any(isinstance(r, NoScriptError) for r in replies):
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies
        await script.load(client, keys)
    return [await script(client, keys, extra, args) for extra, args in calls]
