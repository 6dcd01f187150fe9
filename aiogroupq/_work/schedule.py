"""Periodic tasks: :class:`Schedule` and the scheduler each Consumer runs.

Every consumer given schedules runs the same loop for each of them, and all of
them race: there is no leader. ``enqueue.lua`` decides, atomically, that a
tick is enqueued only if it is later than the schedule's last enqueued tick
(the key ``sched:<name>``), so exactly one consumer wins each tick. Which tick
is due is judged on the Redis server's clock (``TIME``); the local clock only
decides how long to sleep before asking again.
"""

from __future__ import annotations

__all__ = ("Schedule", "Scheduler")

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
import msgspec

from .._limits import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_ATTEMPTS
from .._store import routing as _routing, scripts as _scripts, validate as _validate
from .._store.codec import EncodeFailure, encode_payload, identity, pack
from .._store.connection import REDIS_FAILURES, node_of
from .._store.partition import Partitions, in_partition
from .._store.replies import GroupCorruptRefusal, GroupFullRefusal
from ..errors import AiogroupqError, ConfigurationError, UnencodablePayloadError
from ..task import Envelope, new_task_id

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

    from .._store.connection import Client

logger: logging.Logger = logging.getLogger("aiogroupq._schedule")

#: shortest ``every``: each tick costs every consumer two round trips
MIN_EVERY: Final = 0.1
#: longest ``every``, 366 days: ticks are counted from the Unix epoch, so a
#: longer one falls on dates nobody reads off it (``cron`` says when)
MAX_EVERY: Final = 366 * 86_400.0
#: how far ahead of its tick a run is enqueued, as a delayed task due at the
#: tick: the server's delayed-task timer then starts it on time, whatever the
#: scheduler's own wake-up jitter
LEAD_MS: Final = 500
#: a consumer that fell behind (a stalled loop, Redis unreachable) still
#: enqueues, late, each tick of this last stretch that it missed; of older
#: ticks only the latest runs. At most a minute's worth of normal load at once.
CATCH_UP_MS: Final = 60_000
#: longest sleep between two looks at the server's clock, so that a stepped
#: clock (either one) is noticed
MAX_SLEEP: Final = 30.0
_BACKOFF_FIRST, _BACKOFF_MAX = 0.05, 5.0
#: bound of the steps past cronsim's wall-clock quirks: a repeated stretch of
#: wall time (at most a couple of hours) holds at most this many minute ticks
_MAX_STEPS: Final = 256

# Debian cron's macros; @reboot has no meaning for a queue.
_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

Missed = Literal["skip", "once"]


class _Ticks(Protocol):
    """The instants a schedule fires at, in Unix ms."""

    #: how far ahead of a tick its run is enqueued
    lead_ms: int

    def after(self, ms: int) -> int | None:
        """The first tick later than *ms* (None: there is none)."""

    def at_or_before(self, ms: int) -> int | None:
        """The latest tick not later than *ms* (None: there is none)."""


class _IntervalTicks:
    """Every *every_ms* since the Unix epoch: the same instants for every
    consumer, with no state to share."""

    __slots__ = ("every_ms", "lead_ms")

    def __init__(self, every_ms: int) -> None:
        self.every_ms = every_ms
        self.lead_ms = min(LEAD_MS, every_ms // 2)

    def after(self, ms: int) -> int | None:
        return (ms // self.every_ms + 1) * self.every_ms

    def at_or_before(self, ms: int) -> int | None:
        return ms // self.every_ms * self.every_ms


class _CronTicks:
    """A cron expression's instants in a time zone, as cronsim computes them
    (Debian cron's rules, DST included)."""

    __slots__ = ("expr", "lead_ms", "zone")

    def __init__(self, expr: str, zone: ZoneInfo) -> None:
        try:
            import cronsim
        except ImportError:
            raise ConfigurationError(
                f"cron={expr!r} needs the cronsim package: "
                "pip install 'aiogroupq[cron]'"
            ) from None
        self.expr = _MACROS.get(expr.strip().lower(), expr)
        if len(self.expr.split()) != 5:
            # cronsim reads a sixth field as seconds; the scheduler's steps
            # past a repeated wall-clock hour are bounded for minute ticks.
            raise ConfigurationError(
                f"cron expression {expr!r} has {len(self.expr.split())} fields; "
                "it takes five (minute hour day-of-month month day-of-week): "
                "for ticks under a minute, use every="
            )
        self.zone = zone
        self.lead_ms = LEAD_MS
        try:
            cronsim.CronSim(self.expr, datetime.now(zone))
        except cronsim.CronSimError as exc:
            raise ConfigurationError(f"cron expression {expr!r}: {exc}") from None

    def _local(self, ms: int, extra_us: int = 0) -> datetime:
        # fromtimestamp() sets fold for a repeated wall time; replace() keeps
        # it. Adding a timedelta instead would move along the wall clock.
        return datetime.fromtimestamp(ms // 1000, self.zone).replace(
            microsecond=ms % 1000 * 1000 + extra_us
        )

    def after(self, ms: int) -> int | None:
        from cronsim import CronSim

        it = CronSim(self.expr, self._local(ms))
        # cronsim walks fixed-time expressions along the wall clock: from the
        # second pass of a repeated wall time (DST ends) it answers ticks of
        # the first pass, which are already past. Step on until one is later.
        for _ in range(_MAX_STEPS):
            try:
                tick = _ms(next(it))
            except StopIteration:  # none within cronsim's 50-year horizon
                return None
            if tick > ms:
                return tick
        raise AssertionError(f"cron {self.expr!r} does not move past {ms} ms")

    def at_or_before(self, ms: int) -> int | None:
        from cronsim import CronSim

        # One microsecond past *ms*: cronsim drops the microseconds as its
        # first step back, so a tick exactly at *ms* is found.
        it = CronSim(self.expr, self._local(ms, 1), reverse=True)
        try:
            tick = _ms(next(it))
        except StopIteration:
            return None
        # Going back from the second pass of a repeated wall time, cronsim
        # lands on the same wall time's first pass, possibly before later
        # ticks of that pass: walk forward to the last one not after *ms*.
        for _ in range(_MAX_STEPS):
            later = self.after(tick)
            if later is None or later > ms:
                return tick
            tick = later
        raise AssertionError(f"cron {self.expr!r} does not settle before {ms} ms")


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _every_seconds(every: object) -> float:
    """*every* in seconds, from :data:`MIN_EVERY` to :data:`MAX_EVERY`."""
    value = every.total_seconds() if isinstance(every, timedelta) else every
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not MIN_EVERY <= value <= MAX_EVERY
    ):
        raise ConfigurationError(
            f"every must be from {MIN_EVERY} to {MAX_EVERY:,.0f} seconds (366 "
            f"days; longer periods: cron=), got {every!r}"
        )
    return float(value)


def _zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str):
        raise ConfigurationError(
            f"tz must be a time zone name such as 'Europe/Paris', got {tz!r}"
        )
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r} (a name of the tz database such as "
            "'Europe/Paris'; without a system tz database, pip install tzdata)"
        ) from None


@dataclass(frozen=True, eq=False, init=False)
class Schedule:
    """A task enqueued periodically, by whichever consumer gets there first.

    Give schedules to :class:`Consumer` (``schedules=[...]``). Every consumer
    of the queue that has a schedule takes part; exactly one enqueue happens
    per tick, decided atomically in Redis on the server's clock.

    :param name: identifies the schedule within its queue (1-200 characters);
        consumers that declare the same name share its ticks
    :param task_type: the handler that runs it; the consumer must have it
    :param cron: a cron expression (five fields, minute first; names,
        ranges, steps, lists, Debian's ``@daily``-style macros), evaluated in
        *tz*. Needs the ``cronsim`` package: ``pip install 'aiogroupq[cron]'``
    :param every: instead of *cron*: seconds (or a timedelta, from 0.1 s to
        366 days, rounded to whole milliseconds) between ticks, counted from the Unix
        epoch, so every consumer agrees on them
    :param tz: the time zone *cron* is read in: a tz database name such as
        ``"Europe/Paris"`` (default ``"UTC"``); *every* takes only ``"UTC"``
    :param payload: the payload of every run (any MessagePack-encodable value)
    :param group: run as tasks of this group: runs never overlap and start in
        tick order (``None``: a run may start while the previous one runs)
    :param missed: a tick that passed while no consumer with this schedule
        ran: ``"skip"`` it, or enqueue the latest such tick ``"once"`` when a
        consumer starts
    :param max_attempts: as for :meth:`Producer.enqueue` (default 3)
    :param timeout: seconds one attempt may run
    :param priority: 0 to 9, as for :meth:`Producer.enqueue`
    :param expires: seconds (or a timedelta) after its tick within which a
        run must start, else it ends ``expired`` without running
    :raises ConfigurationError: for an unusable name, cron expression, interval,
        time zone or *missed*
    :raises InvalidTaskError: (or a subclass) for an unusable task field, as
        :meth:`Producer.enqueue` would raise it
    """

    name: str
    task_type: str
    cron: str | None
    every: float | None
    tz: str
    payload: Any
    group: str | None
    missed: Missed
    max_attempts: int | None
    timeout: float | None
    priority: int | None
    expires: float | None
    _ticks: _Ticks = field(repr=False)
    _encoded: msgspec.Raw = field(repr=False)

    def __init__(
        self,
        name: str,
        task_type: str,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        payload: Any = None,
        group: str | None = None,
        missed: Missed = "skip",
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        priority: int | None = None,
        expires: float | timedelta | None = None,
    ) -> None:
        if not isinstance(name, str) or not 1 <= len(name) <= 200:
            raise ConfigurationError(
                f"a schedule name must be 1-200 characters, got {name!r}"
            )
        if missed not in ("skip", "once"):
            raise ConfigurationError(f"missed must be 'skip' or 'once', got {missed!r}")
        zone = _zone(tz)
        ticks: _Ticks
        if (cron is None) == (every is None):
            raise ConfigurationError(
                f"schedule {name!r} needs exactly one of cron= and every=, "
                f"got cron={cron!r}, every={every!r}"
            )
        if cron is not None:
            if not isinstance(cron, str):
                raise ConfigurationError(
                    f"cron must be a str such as '*/5 * * * *', got {cron!r}"
                )
            ticks = _CronTicks(cron, zone)
            if ticks.after(_ms(datetime.now(zone))) is None:
                raise ConfigurationError(f"cron expression {cron!r} never fires")
            seconds = None
        else:
            if zone.key != "UTC":
                raise ConfigurationError(
                    f"tz={zone.key!r} applies to cron= only: every= counts from "
                    "the Unix epoch; for times of day in a zone, use cron="
                )
            seconds = _every_seconds(every)
            ticks = _IntervalTicks(round(seconds * 1000))
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "task_type", _validate.name("task_type", task_type))
        set_(self, "cron", cron)
        set_(self, "every", seconds)
        set_(self, "tz", zone.key)
        set_(self, "payload", payload)
        set_(self, "group", _validate.group(group))
        set_(self, "missed", missed)
        set_(self, "max_attempts", _validate.max_attempts(max_attempts))
        set_(self, "timeout", _validate.seconds("timeout", timeout, allow_zero=False))
        set_(self, "priority", _validate.priority(priority))
        set_(self, "expires", _validate.seconds("expires", expires, allow_zero=False))
        try:
            set_(self, "_encoded", encode_payload(payload))
        except EncodeFailure as exc:
            raise UnencodablePayloadError(payload, str(exc)) from exc
        set_(self, "_ticks", ticks)

    def _new_task(self, tick_ms: int, partition: int = 0) -> _scripts.NewTask:
        """The run of one tick: due at the tick (server clock), guarded by it."""
        task_id = in_partition(new_task_id(), partition)
        envelope = Envelope(
            id=task_id,
            type=self.task_type,
            payload=self._encoded,
            group=self.group,
            max_attempts=self.max_attempts or DEFAULT_MAX_ATTEMPTS,
            timeout_ms=None if self.timeout is None else _validate.to_ms(self.timeout),
            # What a handler reads as current_task().enqueued_at: its tick.
            enqueued_ms=tick_ms,
        )
        return _scripts.NewTask(
            id=task_id,
            group=self.group,
            envelope=pack(envelope),
            delay_ms=0,
            max_attempts=envelope.max_attempts,
            dedup_key=None,
            run_at_ms=tick_ms,
            priority=self.priority,
            expire_at_ms=0
            if self.expires is None
            else tick_ms + _validate.to_ms(self.expires),
            schedule=self.name,
            tick_ms=tick_ms,
            identity=identity(envelope),
        )


@dataclass(slots=True)
class _Progress:
    """What one consumer knows of one schedule."""

    #: the server's clock when this consumer first read it: ticks up to then
    #: passed before it took part (the *missed* policy decides)
    start: int | None = None
    #: the latest tick known to be enqueued (or given up): later ones are due
    cursor: int = -1


class Scheduler:
    """Runs every schedule of one consumer until :meth:`stop`."""

    def __init__(self, parts: Partitions, schedules: Sequence[Schedule]) -> None:
        self._parts = parts
        self._schedules = tuple(schedules)
        self._scope: anyio.CancelScope | None = None
        self._dedup_window_ms = _validate.to_ms(DEFAULT_DEDUP_WINDOW)

    def stop(self) -> None:
        """Stop enqueueing (a run already enqueued stays)."""
        if self._scope is not None:
            self._scope.cancel()

    async def run(
        self,
        client: Client,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Run until stopped; started once every schedule has looked at the
        server's clock (and enqueued a missed tick, with ``missed="once"``)."""
        logger.info(
            "scheduling %s on queue %r",
            ", ".join(repr(s.name) for s in self._schedules),
            self._parts.queue,
        )
        started = False
        with anyio.CancelScope() as self._scope:
            async with anyio.create_task_group() as tg:
                for schedule in self._schedules:
                    await tg.start(self._loop, client, schedule)
                task_status.started()
                started = True
        if not started:  # stopped before every schedule had started
            task_status.started()

    async def _loop(
        self,
        client: Client,
        schedule: Schedule,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        progress = _Progress()
        backoff = _BACKOFF_FIRST
        started = False
        while True:
            pause: float | None
            try:
                pause = await self._step(client, schedule, progress)
                backoff = _BACKOFF_FIRST
            except (*REDIS_FAILURES, AiogroupqError) as exc:
                logger.warning(
                    "schedule %r: %s; trying again in %.2fs",
                    schedule.name,
                    exc,
                    backoff,
                )
                pause, backoff = backoff, min(backoff * 2, _BACKOFF_MAX)
            except Exception:
                # A bug of ours must not stop the consumer's other work.
                logger.exception("schedule %r failed", schedule.name)
                pause = _BACKOFF_MAX
            if not started:
                task_status.started()
                started = True
            if pause is None:
                logger.info("schedule %r has no more ticks", schedule.name)
                return
            await anyio.sleep(pause)

    async def _step(
        self, client: Client, schedule: Schedule, progress: _Progress
    ) -> float | None:
        """Enqueue what is due; return seconds to sleep (None: no more ticks)."""
        # A grouped schedule's key lives with its group, another one in
        # partition 0 (see Partitions.place).
        partition = self._parts.place(schedule.group, None, schedule.name)
        key = self._parts.keys(partition).schedule(schedule.name)
        async with client.pipeline(transaction=False) as pipe:
            pipe.time(**node_of(client, key))
            pipe.get(key)
            (seconds, micros), raw = await pipe.execute()
        now = int(seconds) * 1000 + int(micros) // 1000
        if progress.start is None:
            progress.start = now
        if raw is None:
            # No consumer has run this schedule yet: it begins now, and a tick
            # that passes from here on while every consumer is down is missed.
            await client.set(key, now, nx=True)
            return 0.0
        try:
            last = int(raw)
        except ValueError:
            logger.error(
                "schedule %r: key %s holds %r, not a tick; counting from now",
                schedule.name,
                key,
                raw,
            )
            last = now
        ticks = schedule._ticks
        cursor = max(progress.cursor, last)
        due = self._due(schedule, progress.start, cursor, now)
        upcoming = ticks.after(max(cursor, now))
        if upcoming is not None and upcoming - now <= ticks.lead_ms:
            due.append(upcoming)  # due at its tick, on the server's clock
        if due:
            await self._enqueue(client, schedule, due)
        # Every tick up to now is enqueued, skipped or given up by now.
        progress.cursor = max(cursor, *due, ticks.at_or_before(now) or cursor)
        nxt = ticks.after(max(progress.cursor, now))
        if nxt is None:
            return None
        return min(MAX_SLEEP, max(0.0, (nxt - ticks.lead_ms - now) / 1000))

    def _due(self, schedule: Schedule, start: int, cursor: int, now: int) -> list[int]:
        """The ticks in (cursor, now] to enqueue now, oldest first."""
        ticks = schedule._ticks
        due: list[int] = []
        first = ticks.after(cursor)
        if first is None or first > now:
            return due
        if first <= start:
            # They passed before this consumer took part, and no consumer
            # enqueued them: the schedule's missed policy decides.
            latest = ticks.at_or_before(start)
            if schedule.missed == "once" and latest is not None:
                logger.info(
                    "schedule %r: enqueuing missed tick %s once",
                    schedule.name,
                    _show(latest),
                )
                due.append(latest)
            else:
                logger.info(
                    "schedule %r: skipping the ticks missed since %s",
                    schedule.name,
                    _show(first),
                )
        # Ticks that passed while this consumer ran are late, not missed:
        # those of the catch-up stretch run, each once; of older ones, only
        # the latest, and only if the stretch has none.
        floor = max(cursor, start)
        window = max(floor, now - CATCH_UP_MS)
        oldest = ticks.after(floor)
        recent = ticks.after(window)
        if oldest is not None and oldest <= window:
            logger.warning(
                "schedule %r fell behind: ticks from %s to %s came too late",
                schedule.name,
                _show(oldest),
                _show(window),
            )
            latest_old = ticks.at_or_before(window)
            if latest_old is not None and (recent is None or recent > now):
                due.append(latest_old)
        while recent is not None and recent <= now:
            due.append(recent)
            recent = ticks.after(recent)
        return due

    async def _enqueue(
        self, client: Client, schedule: Schedule, ticks: list[int]
    ) -> None:
        partition = self._parts.place(schedule.group, None, schedule.name)
        tasks = [schedule._new_task(tick, partition) for tick in ticks]
        try:
            ids = await _routing.send(
                client, self._parts, tasks, dedup_window_ms=self._dedup_window_ms
            )
        except (GroupFullRefusal, GroupCorruptRefusal) as refusal:
            # Not worth retrying each tick: log and let the next tick try.
            logger.error(
                "schedule %r: ticks %s not enqueued: group %r %s",
                schedule.name,
                ", ".join(map(_show, ticks)),
                schedule.group,
                "is at its max_size"
                if isinstance(refusal, GroupFullRefusal)
                else "has a damaged key (run 'aiogroupq check')",
            )
            return
        for tick, task_id in zip(ticks, ids, strict=True):
            if task_id:
                logger.debug(
                    "schedule %r: tick %s enqueued as task %s",
                    schedule.name,
                    _show(tick),
                    task_id,
                    extra={"task_id": task_id},
                )


def _show(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
