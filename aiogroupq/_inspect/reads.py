"""Reading a queue's views: each is one read-only script call
(``stats.lua``, ``group_info.lua``, ``consumers.lua``, ``task_info.lua``,
flagged ``no-writes``, so a replica can answer too) that reads indexes and
counters the other scripts keep, never a scan of the queue's keys. The
scripts return raw facts; this module turns them into the dataclasses of
``_inspect/views.py`` and works out a group's state and the sentence that says why
it is (not) running.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
from redis.exceptions import NoScriptError

from .._store.codec import unpack
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
    from .._store.keys import QueueKeys
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
    heads = [_int(v) for v in (r[13], r[14], r[15]) if v is not None]
    next_due = None if r[16] is None else max(0, _int(r[16]) - now_ms) / 1000
    return QueueStats(
        queue=keys.queue,
        exists=r[1] == 1,
        now=now_ms / 1000,
        paused=r[2] == 1,
        ready=_int(r[3]) + _int(r[4]),
        parked=counters.get("parked", 0),
        held=counters.get("held", 0),
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


async def group_infos(
    client: Client, keys: QueueKeys, groups: Sequence[str], *, alive: int | None = None
) -> list[GroupInfo]:
    """These groups as seen now (one ``group_info.lua`` call). *alive*: the
    live consumers, when the registry is in another partition than *keys*
    (each partition's own is empty)."""
    reply = await GROUP_INFO(client, keys, (), ("groups", *groups))
    return _described(reply, alive)[0]


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
    infos, next_cursor = _described(reply, alive)
    return GroupPage(tuple(infos), next_cursor)


def _described(
    reply: Sequence[Any], alive: int | None
) -> tuple[list[GroupInfo], int | None]:
    now_ms, queue_paused = _int(reply[0]), reply[1] == 1
    if alive is None:
        alive = _int(reply[2])
    cursor = _int(reply[3], -1)
    infos = [_group(row, now_ms, queue_paused, alive) for row in reply[4:]]
    return infos, None if cursor < 0 else cursor


def _group(
    row: Sequence[Any], now_ms: int, queue_paused: bool, alive: int
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
    holders = []
    for h in row[16]:
        tid, mark, _, attempt, max_attempts, consumer, dt, lease, due = h
        slot = _SLOTS.get(_text(mark), "running")
        if slot == "running":
            due_at = None
        elif slot == "retry":
            due_at = _secs(due)
        elif slot == "held" and rate_free_at is not None:
            due_at = rate_free_at
        else:
            due_at = _secs(dt)
        holders.append(
            GroupTask(
                _text(tid),
                slot,
                _int(attempt),
                _int(max_attempts, 1),
                _opt_text(consumer) if slot == "running" else None,
                _secs(lease) if slot == "running" else None,
                due_at,
            )
        )
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
    )
    state, reason = _why(info, ready=ready, retry=retry, held=held)
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


def _why(
    info: GroupInfo, *, ready: int, retry: int, held: int
) -> tuple[GroupState, str]:
    now, g = info.now, info.group
    behind = f"; {info.backlog} more wait in line" if info.backlog else ""
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
        nobody = "; no consumer is alive" if info.consumers_alive == 0 else ""
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
        return GroupState.DELAYED, (f"{info.delayed} delayed tasks, none due yet")
    return GroupState.IDLE, "no live task"


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
    """One task as seen now, ``None`` if there is no such task."""
    reply = await TASK_INFO(client, keys, (), (task_id,))
    if not reply:
        return None
    now_ms, raw, lease, due, _, pttl, mark, ahead = reply
    f = _pairs(raw)
    state_text = _text(f.get("s") or b"")
    try:
        state = TaskState(state_text)
    except ValueError:
        raise CorruptTaskError(task_id, f"unknown state {state_text!r}") from None
    task_type, enqueued_at, payload = None, None, None
    if f.get("e") is not None:
        try:
            envelope = unpack(bytes(f["e"]))
            task_type, enqueued_at = envelope.type, envelope.enqueued_ms / 1000 or None
            payload = msgspec.msgpack.decode(envelope.payload)
        except Exception:  # noqa: BLE001, S110 - any stored bytes: shown as unknown
            pass
    slot: Slot | None = None
    if mark is not None:
        slot = _SLOTS.get(_text(mark), "running")
    elif ahead is not None:
        slot = "line"
    ended = state not in (TaskState.QUEUED, TaskState.DELAYED, TaskState.RUNNING)
    return TaskDetails(
        id=task_id,
        state=state,
        type=task_type,
        group=_opt_text(f.get("g")),
        priority=_int(f.get("p")),
        attempt=_int(f.get("a")),
        max_attempts=_int(f.get("m"), 1),
        consumer=_opt_text(f.get("c")),
        lease_deadline=_secs(lease) if state == TaskState.RUNNING else None,
        due_at=_secs(due),
        runnable_since=_secs(f.get("dt")),
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
