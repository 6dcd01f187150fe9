"""Reading a queue's views: each is one read-only script call
(``stats.lua``, ``group_info.lua``, ``consumers.lua``, ``task_info.lua``,
flagged ``no-writes``, so a replica can answer too) that reads indexes and
counters the other scripts keep, never a scan of the queue's keys. The
scripts return raw facts; this module turns them into the dataclasses of
``_inspect/views.py`` and works out a group's state and the sentence that says why
it is (not) running.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import msgspec
from redis.exceptions import NoScriptError

from .._store.codec import unpack
from .._store.keys import QueueKeys
from .._store.registry import COUNTERS
from .._store.replies import NOT_A_TASK, text as _text
from .._store.scripts import CONSUMERS, GROUP_INFO, STATS, STATUSES, TASK_INFO
from ..errors import CorruptTaskError
from ..task import TaskState
from .views import (
    ConsumerInfo,
    ConsumerStats,
    GroupInfo,
    GroupPage,
    GroupSort,
    GroupState,
    GroupTask,
    QueueStats,
    Slot,
    TaskDetails,
    span_text,
)

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .._store.connection import Client
    from .._store.lua import Script

#: live consumers listed in :attr:`QueueStats.consumers`
STATS_CONSUMERS: Final = 100
#: task ids per ``statuses.lua`` call (a millisecond or two of server time)
STATUS_CHUNK: Final = 500
#: the lifetime counters of the ``stats`` hash (``QueueStats.totals``)
TOTALS: Final = (
    "enqueued",
    "started",
    "succeeded",
    "retried",
    "dead",
    "cancelled",
    "expired",
    "recovered",
)


# -- reading replies -----------------------------------------------------------


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _int(value: Any, default: int = 0) -> int:
    """A reply number or stored counter; *default* if missing or unusable."""
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return default


def _secs(value: Any) -> float | None:
    """Server milliseconds as Unix seconds, ``None`` if missing."""
    if value is None:
        return None
    try:
        return float(value) / 1000
    except (TypeError, ValueError):
        return None


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _consumer(row: Sequence[Any], now_ms: int) -> ConsumerInfo:
    name, gone_at, host, pid, hb, ttl, started, n, conc, *counts = row
    in_flight = _int(n)
    numbers = dict(zip(COUNTERS, (_int(c) for c in counts), strict=False))
    return ConsumerInfo(
        name=_text(name),
        host=_text(host or b""),
        pid=_int(pid),
        alive=_int(gone_at) >= now_ms,
        last_heartbeat=_secs(hb) or 0.0,
        started=_secs(started) or 0.0,
        in_flight=in_flight,
        concurrency=_int(conc),
        lease_ttl=(_secs(ttl) or 0.0),
        stats=ConsumerStats(
            **{field: numbers.get(field, 0) for field in COUNTERS}, running=in_flight
        ),
    )


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
        consumers=tuple(_consumer(row, now_ms) for row in r[18]),
        oldest_waiting=max(0, now_ms - min(heads)) / 1000 if heads else None,
        next_due_in=next_due,
        totals={name: counters.get(name, 0) for name in TOTALS},
    )


# -- groups --------------------------------------------------------------------

_SLOTS: Final[dict[str, Slot]] = {"@": "ready", "r": "retry", "~": "held"}

#: a consumer as the registry has it: when it counts as gone and its latest
#: heartbeat (server ms), each ``None`` if it is not registered
Beat = tuple[int | None, int | None]


async def group_infos(
    client: Client, keys: QueueKeys, groups: Sequence[str], *, alive: int | None = None
) -> list[GroupInfo]:
    """These groups as seen now (one ``group_info.lua`` call). *alive*: the
    live consumers, when the registry is in another partition than *keys*
    (each partition's own is empty); the consumers of running tasks are then
    looked up there (one more round trip)."""
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


async def registry_beats(
    client: Client,
    keys: QueueKeys,
    names: Iterable[str],
    *,
    now_ms: int | None = None,
) -> tuple[dict[str, Beat], int | None]:
    """What the consumer registry (partition 0's, whatever partition *keys*
    is) says of each consumer in *names* and, given *now_ms*, how many
    consumers are alive then: one pipeline. A damaged registry key reads as
    "not registered" (``aiogroupq check`` reports it)."""
    wanted = sorted(set(names))
    if not wanted and now_ms is None:
        return {}, None
    registry = keys if keys.partition == 0 else QueueKeys(keys.queue)
    async with client.pipeline(transaction=False) as pipe:
        for name in wanted:
            pipe.zscore(registry.consumers, name)
            pipe.hget(registry.consumer_info(name), "hb")
        if now_ms is not None:
            pipe.zcount(registry.consumers, now_ms, "+inf")
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    beats = {
        name: (_opt_int(replies[2 * i]), _opt_int(replies[2 * i + 1]))
        for i, name in enumerate(wanted)
    }
    return beats, None if now_ms is None else _opt_int(replies[-1]) or 0


def _opt_int(value: Any) -> int | None:
    if value is None or isinstance(value, Exception):
        return None
    number = _int(value, -1)
    return None if number < 0 else number


async def _described(
    client: Client, keys: QueueKeys, reply: Sequence[Any], alive: int | None
) -> tuple[list[GroupInfo], int | None]:
    now_ms, queue_paused = _int(reply[0]), reply[1] == 1
    if alive is None:
        alive = _int(reply[2])
    cursor = _int(reply[3], -1)
    rows = reply[4:]
    beats: dict[str, Beat] | None = None
    if keys.partition != 0:  # the script read this partition's empty registry
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
    infos = [_group(row, now_ms, queue_paused, alive, beats) for row in rows]
    return infos, None if cursor < 0 else cursor


def _holder(
    h: Sequence[Any],
    now_ms: int,
    rate_free_at: float | None,
    beats: dict[str, Beat] | None,
) -> GroupTask:
    tid, mark, _, attempt, max_attempts, consumer, dt, lease, due, gone, hb = h
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
    if name is not None:
        gone_ms, beat_ms = (
            (_opt_int(gone), _opt_int(hb))
            if beats is None
            else beats.get(name, (None, None))
        )
        alive = gone_ms is not None and gone_ms >= now_ms
        beat = None if beat_ms is None else beat_ms / 1000
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
    )


def _group(
    row: Sequence[Any],
    now_ms: int,
    queue_paused: bool,
    alive: int,
    beats: dict[str, Beat] | None = None,
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
    holders = [_holder(h, now_ms, rate_free_at, beats) for h in row[16]]
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
    )
    state, reason = _why(info, ready=ready, retry=retry, held=held, horizon=horizon)
    return _replace(info, state, reason)


def _replace(info: GroupInfo, state: GroupState, reason: str) -> GroupInfo:
    fields = {name: getattr(info, name) for name in GroupInfo.__slots__}
    fields.update(state=state, reason=reason)
    return GroupInfo(**fields)


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "?"
    return f"{span_text(now - then)} ago"


def _in(now: float, then: float | None) -> str:
    if then is None:
        return "?"
    return f"in {span_text(then - now)}" if then > now else "now"


def _at(then: float) -> str:
    """A server time of day, UTC (the times these sentences name are within
    hours of now)."""
    return datetime.fromtimestamp(then, UTC).strftime("%H:%M:%SZ")


def stall_text(
    now: float,
    subject: str,
    consumer_alive: bool | None,
    heartbeat: float | None,
    lease_deadline: float | None,
    consumers_alive: int,
) -> str | None:
    """Why a running task may be running no more: *subject* (its consumer,
    named) stopped heartbeating, or the lease ran out; with when the lease
    ends and what recovers the task. ``None`` while the consumer is alive and
    the lease lasts."""
    overdue = lease_deadline is not None and lease_deadline <= now
    if consumer_alive and not overdue:
        return None
    if consumer_alive:
        who = f"{subject} is alive but did not renew the lease"
    elif heartbeat is not None:
        who = f"{subject} stopped heartbeating {span_text(now - heartbeat)} ago"
    else:
        who = f"{subject} is not alive (not in the consumer registry)"
    # The lease's end as a time of day, not "in 20s": the sentence stays
    # the same from one read to the next while nothing changes.
    if lease_deadline is None:
        lease = "the lease is gone"
    elif overdue:
        lease = f"the lease ended at {_at(lease_deadline)}"
    else:
        lease = f"the lease ends at {_at(lease_deadline)}"
    if consumers_alive == 0:
        then = "no consumer is alive to recover the task: start one"
    elif overdue or lease_deadline is None:
        then = "the next claim recovers the task"
    else:
        then = "the first claim after that recovers the task"
    return f"{who}; {lease}; {then}"


def _stall(info: GroupInfo) -> str | None:
    """The first running holder that may be running no more, said as
    :func:`stall_text` says it (and how many more there are)."""
    said = [
        text
        for h in info.holders
        if h.slot == "running"
        and h.consumer is not None
        and (
            text := stall_text(
                info.now,
                f"task {h.id}'s consumer {h.consumer}",
                h.consumer_alive,
                h.consumer_heartbeat,
                h.lease_deadline,
                info.consumers_alive,
            )
        )
        is not None
    ]
    if not said:
        return None
    more = f" ({len(said) - 1} more running tasks are in the same case)"
    return said[0] + (more if len(said) > 1 else "")


def _why(
    info: GroupInfo,
    *,
    ready: int,
    retry: int,
    held: int,
    horizon: float | None = None,
) -> tuple[GroupState, str]:
    state, reason = _why_state(
        info, ready=ready, retry=retry, held=held, horizon=horizon
    )
    stall = _stall(info)
    if stall is None:
        return state, reason
    if state == GroupState.RUNNING:  # instead of its consumer and lease
        return state, f"{info.running} running, but {stall}"
    if state == GroupState.AT_CAP:
        return state, f"{reason}; but {stall}"
    return state, f"{reason}; meanwhile {stall}"


def _why_state(
    info: GroupInfo, *, ready: int, retry: int, held: int, horizon: float | None
) -> tuple[GroupState, str]:
    now, g = info.now, info.group
    behind = f"; {info.backlog} more wait in line" if info.backlog else ""
    nobody = "; no consumer is alive" if info.consumers_alive == 0 else ""
    head = info.head
    if info.halted_by is not None:
        why = f": {info.halted_reason}" if info.halted_reason else ""
        return GroupState.HALTED, (
            f"halted behind dead task {info.halted_by}{why}; requeue or purge it, "
            f"or release the group (aiogroupq release {g}){behind}"
        )
    if info.paused or info.queue_paused:
        which = (
            f"the group is paused (aiogroupq resume {g})"
            if info.paused
            else "the whole queue is paused (aiogroupq resume)"
        )
        waiting = ready + retry + held + info.backlog
        return GroupState.PAUSED, (
            f"{which}: nothing new starts; {info.running} running, {waiting} waiting"
        )
    if held and head is not None:
        limit = info.rate or (0, 0.0)
        return GroupState.RATE_LIMITED, (
            f"its rate limit ({limit[0]} starts per {span_text(limit[1])}) is used up: "
            f"task {head.id} may start {_in(now, info.rate_free_at)}{behind}"
        )
    if retry and head is not None:
        return GroupState.WAITING_RETRY, (
            f"task {head.id} failed attempt {head.attempt} of {head.max_attempts} "
            f"and retries {_in(now, head.due_at)}; later tasks wait behind it"
            f"{behind}"
        )
    if ready and head is not None:
        return GroupState.READY, (
            f"task {head.id} is runnable since {_ago(now, head.due_at)} and waits "
            f"for a free consumer{nobody}{behind}"
        )
    if info.running and info.backlog:
        return GroupState.AT_CAP, (
            f"{info.running} running, at its concurrency of {info.concurrency}; "
            f"{info.backlog} wait in line behind"
        )
    if info.running:
        first = info.holders[0] if info.holders else None
        where = (
            f": task {first.id} on consumer {first.consumer}, lease until "
            f"{_in(now, first.lease_deadline)}"
            if first is not None and first.slot == "running"
            else ""
        )
        return GroupState.RUNNING, f"{info.running} running{where}"
    if info.delayed:
        return GroupState.DELAYED, _delayed(info, horizon, nobody)
    return GroupState.IDLE, "no live task"


def _delayed(info: GroupInfo, horizon: float | None, nobody: str) -> str:
    now, due, n = info.now, info.next_due_at, info.delayed
    if due is not None and due <= now:
        return (
            f"{n} delayed tasks: the first was due {span_text(now - due)} ago "
            f"(at {_at(due)}) and the next claim makes it runnable{nobody}"
        )
    if due is not None:
        return (
            f"{n} delayed tasks, none due yet: the first is due "
            f"{_in(now, due)} (at {_at(due)})"
        )
    if horizon is not None:
        return (
            f"{n} delayed tasks, none due before {_at(horizon)} ({_in(now, horizon)})"
        )
    return f"{n} delayed tasks, none due yet"


# -- consumers -----------------------------------------------------------------


async def consumer_list(
    client: Client, keys: QueueKeys, limit: int
) -> list[ConsumerInfo]:
    """Registered consumers, live ones first (one ``consumers.lua`` call)."""
    reply = await CONSUMERS(client, keys, (), (limit,))
    now_ms = _int(reply[0])
    return [_consumer(row, now_ms) for row in reply[1]]


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
    state_text = _text(f.get("s") or b"")
    try:
        state = TaskState(state_text)
    except ValueError:
        raise CorruptTaskError(task_id, f"unknown state {state_text!r}") from None
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
    slot: Slot | None = None
    if mark is not None:
        slot = _SLOTS.get(_text(mark), "running")
    elif ahead is not None:
        slot = "line"
    consumer = _opt_text(f.get("c"))
    alive: int | None = None
    consumer_alive: bool | None = None
    heartbeat: float | None = None
    if state in (TaskState.QUEUED, TaskState.RUNNING):
        running = consumer if state == TaskState.RUNNING else None
        beats, alive = await registry_beats(
            client, keys, [running] if running else [], now_ms=_int(now_ms)
        )
        if running is not None:
            gone_ms, beat_ms = beats.get(running, (None, None))
            consumer_alive = gone_ms is not None and gone_ms >= _int(now_ms)
            heartbeat = None if beat_ms is None else beat_ms / 1000
    group_paused, halted_by, rate_free_at = False, None, None
    if facts:
        group_paused, halted_by = facts[0] == 1, _opt_text(facts[1])
        rate_free_at = _secs(facts[2])
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
        consumer_alive=consumer_alive,
        consumer_heartbeat=heartbeat,
    )
    reason = _task_reason(
        details,
        queue_paused=queue_paused == 1,
        group_paused=group_paused,
        halted_by=halted_by,
        alive=alive,
    )
    return dataclasses.replace(details, reason=reason)


def _identity(value: Any) -> tuple[str | None, float | None, int | None]:
    """An ended task's ``i`` field: its type, enqueue time and payload size."""
    if value is None:
        return None, None, None
    enqueued, size, task_type = [*_text(value).split(" ", 2), "", ""][:3]
    return task_type or None, _secs(enqueued or None), _opt_int(size or None)


def _task_reason(
    t: TaskDetails,
    *,
    queue_paused: bool,
    group_paused: bool,
    halted_by: str | None,
    alive: int | None,
) -> str:
    """Why the task runs, waits, or ended: one sentence, as for a group."""
    now, g = t.now, t.group
    if t.state == TaskState.DEAD:
        halts = f"; its group {g} is halted behind it" if halted_by == t.id else ""
        return (
            f"dead-lettered {_ago(now, t.ended_at)}: requeue or purge it "
            f"(aiogroupq dead requeue {t.id}){halts}"
        )
    if t.state not in (TaskState.QUEUED, TaskState.DELAYED, TaskState.RUNNING):
        kept = (
            f"; its state is kept {span_text(t.kept_for)} more"
            if t.kept_for is not None
            else ""
        )
        return f"{t.state} {_ago(now, t.ended_at)}{kept}"
    if t.state == TaskState.RUNNING:
        stall = stall_text(
            now,
            f"its consumer {t.consumer}",
            t.consumer_alive,
            t.consumer_heartbeat,
            t.lease_deadline,
            alive or 0,
        )
        if stall is not None:
            return f"running, but {stall}"
        return (
            f"running on consumer {t.consumer} (attempt {t.attempt} of "
            f"{t.max_attempts}); its lease ends {_in(now, t.lease_deadline)}"
        )
    blocker = None
    if queue_paused:
        blocker = "the whole queue is paused (aiogroupq resume)"
    elif halted_by is not None:
        blocker = (
            f"its group {g} is halted behind dead task {halted_by}: requeue or "
            f"purge it, or release the group (aiogroupq release {g})"
        )
    elif group_paused:
        blocker = f"its group {g} is paused (aiogroupq resume {g})"
    if t.state == TaskState.DELAYED:
        if t.due_at is not None and t.due_at <= now:
            when = (
                f"was due {span_text(now - t.due_at)} ago (at {_at(t.due_at)}): "
                "the next claim makes it runnable"
            )
        else:
            when = f"is due {_in(now, t.due_at)}"
            if t.due_at is not None:
                when += f" (at {_at(t.due_at)})"
        text = (
            f"attempt {t.attempt} of {t.max_attempts} failed; its retry {when}"
            if t.slot == "retry"
            else f"delayed: it {when}"
        )
        return text + (
            f"; even then it does not start while {blocker}" if blocker else ""
        )
    before = ""
    if t.position == 1:
        before = "; 1 task of its group goes before it"
    elif t.position:
        before = f"; {t.position} tasks of its group go before it"
    if blocker is not None:
        return f"it does not start while {blocker}{before}"
    if t.slot == "held":
        return f"its group's rate limit is used up: it may start {_in(now, t.due_at)}"
    if t.slot == "line":
        return f"waits in its group's line{before}"
    nobody = "; no consumer is alive" if alive == 0 else ""
    return (
        f"runnable since {_ago(now, t.runnable_since)} and waits for a free "
        f"consumer{nobody}"
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
    pipeline of EVALSHA.

    A ``NOSCRIPT`` answer (a flushed cache) loads the script and sends the
    pipeline again (the script only reads); if the cache is flushed again
    in between, each call goes through :class:`Script`, which falls back
    to EVAL.
    """
    for _ in range(2):
        async with client.pipeline(transaction=False) as pipe:
            for extra_keys, args in calls:
                # Not pipe.evalsha: a cluster pipeline refuses that method.
                pipe.execute_command(*script.command(keys, extra_keys, args))
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        if not any(isinstance(r, NoScriptError) for r in replies):
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return replies
        await script.load(client, keys)
    return [await script(client, keys, extra, args) for extra, args in calls]
