"""Periodic tasks: the tick arithmetic (cron, DST, time zones), the scheduler's
policy, and exactly one enqueue per tick across consumers and processes."""

from __future__ import annotations

import logging
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import hypothesis.strategies as st
import pytest
import redis.asyncio
from hypothesis import given, settings

import aiogroupq
from aiogroupq._check.check import examine
from aiogroupq._store.codec import unpack
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.partition import Partitions
from aiogroupq._work import schedule as _schedule
from aiogroupq._work.schedule import Scheduler, _CronTicks, _IntervalTicks

from . import schedule_app
from ._spawn import PATIENCE, Spawn

NY = ZoneInfo("America/New_York")
UTC = ZoneInfo("UTC")


def ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def local(ms_: int, zone: ZoneInfo = NY) -> str:
    """A tick as wall time with its offset, as the assertions spell it."""
    return datetime.fromtimestamp(ms_ / 1000, zone).isoformat()


def walk(ticks: _CronTicks, start: datetime, n: int) -> list[str]:
    """The *n* ticks after *start*, as local wall times with offsets."""
    out, at = [], ms(start)
    for _ in range(n):
        nxt = ticks.after(at)
        assert nxt is not None
        out.append(local(nxt, ticks.zone))
        at = nxt
    return out


# -- tick arithmetic ----------------------------------------------------------


def test_interval_ticks_count_from_the_epoch() -> None:
    ticks = _IntervalTicks(200)
    assert ticks.after(0) == 200
    assert ticks.after(199) == 200
    assert ticks.after(200) == 400  # strictly later
    assert ticks.at_or_before(200) == 200  # not later
    assert ticks.at_or_before(399) == 200
    assert ticks.lead_ms == 100  # never more than half the interval
    assert _IntervalTicks(60_000).lead_ms == _schedule.LEAD_MS


def test_cron_in_utc_with_names_ranges_steps_and_lists() -> None:
    start = datetime(2024, 1, 5, 10, 7, tzinfo=UTC)  # a Friday
    assert walk(_CronTicks("*/15 * * * *", UTC), start, 3) == [
        "2024-01-05T10:15:00+00:00",
        "2024-01-05T10:30:00+00:00",
        "2024-01-05T10:45:00+00:00",
    ]
    assert walk(_CronTicks("0 9,17 * * MON-FRI", UTC), start, 3) == [
        "2024-01-05T17:00:00+00:00",
        "2024-01-08T09:00:00+00:00",  # the weekend is skipped
        "2024-01-08T17:00:00+00:00",
    ]
    assert walk(_CronTicks("@daily", UTC), start, 1) == ["2024-01-06T00:00:00+00:00"]
    assert walk(_CronTicks("0 0 1 JAN *", UTC), start, 1) == [
        "2025-01-01T00:00:00+00:00"
    ]


def test_cron_is_read_in_its_time_zone() -> None:
    tokyo = ZoneInfo("Asia/Tokyo")
    ticks = _CronTicks("0 9 * * *", tokyo)
    nxt = ticks.after(ms(datetime(2024, 6, 1, 12, 0, tzinfo=UTC)))
    assert nxt is not None
    assert local(nxt, UTC) == "2024-06-02T00:00:00+00:00"  # 09:00 in Tokyo
    assert local(nxt, tokyo) == "2024-06-02T09:00:00+09:00"


def test_dst_spring_forward_a_missing_wall_time_runs_when_the_gap_ends() -> None:
    # New York, 2024-03-10: 02:00 EST jumps to 03:00 EDT; 02:30 never exists.
    # Debian cron (and cronsim) run a fixed-time job of the gap right after it.
    ticks = _CronTicks("30 2 * * *", NY)
    assert walk(ticks, datetime(2024, 3, 9, 12, 0, tzinfo=NY), 3) == [
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
        "2024-03-12T02:30:00-04:00",
    ]
    # An hourly job runs by real time: 01:00 EST, then 03:00 EDT an hour later.
    hourly = walk(
        _CronTicks("0 * * * *", NY), datetime(2024, 3, 10, 0, 30, tzinfo=NY), 3
    )
    assert hourly == [
        "2024-03-10T01:00:00-05:00",
        "2024-03-10T03:00:00-04:00",
        "2024-03-10T04:00:00-04:00",
    ]


def test_dst_spring_forward_in_the_southern_hemisphere() -> None:
    sydney = ZoneInfo("Australia/Sydney")  # 2024-10-06: 02:00 AEST -> 03:00 AEDT
    ticks = _CronTicks("30 2 * * *", sydney)
    assert walk(ticks, datetime(2024, 10, 5, 12, 0, tzinfo=sydney), 2) == [
        "2024-10-06T03:00:00+11:00",
        "2024-10-07T02:30:00+11:00",
    ]


def test_dst_fall_back_a_repeated_wall_time_runs_once() -> None:
    # New York, 2024-11-03: 02:00 EDT goes back to 01:00 EST; 01:30 happens twice.
    ticks = _CronTicks("30 1 * * *", NY)
    assert walk(ticks, datetime(2024, 11, 2, 12, 0, tzinfo=NY), 2) == [
        "2024-11-03T01:30:00-04:00",  # the first 01:30 only
        "2024-11-04T01:30:00-05:00",
    ]
    # Expressions whose minute or hour field starts with * run by real time:
    # every hour, and every 20 minutes of both passes of 01:xx.
    hourly = walk(
        _CronTicks("0 * * * *", NY), datetime(2024, 11, 3, 0, 30, tzinfo=NY), 3
    )
    assert hourly == [
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T02:00:00-05:00",
    ]
    assert (
        len(walk(_CronTicks("*/20 1 * * *", NY), datetime(2024, 11, 3, tzinfo=NY), 6))
        == 6
    )
    assert walk(_CronTicks("*/20 1 * * *", NY), datetime(2024, 11, 3, tzinfo=NY), 6)[
        3:
    ] == [
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T01:20:00-05:00",
        "2024-11-03T01:40:00-05:00",
    ]


def test_from_inside_the_repeated_hour_ticks_move_forward_only() -> None:
    # 01:10 EST is the second pass of 01:xx. cronsim alone answers 01:30 EDT
    # from there (its first pass, already past) and, going back, 01:09 EDT
    # (not the latest tick): the wrapper must do neither.
    second_pass = ms(datetime(2024, 11, 3, 1, 10, tzinfo=NY, fold=1))
    once = _CronTicks("30 1 * * *", NY)
    assert local(once.after(second_pass) or 0) == "2024-11-04T01:30:00-05:00"
    assert local(once.at_or_before(second_pass) or 0) == "2024-11-03T01:30:00-04:00"
    each_minute = _CronTicks("0-59 1 * * *", NY)
    assert local(each_minute.after(second_pass) or 0) == "2024-11-04T01:00:00-05:00"
    assert (
        local(each_minute.at_or_before(second_pass) or 0) == "2024-11-03T01:59:00-04:00"
    )


# A year with both DST changes in each zone, and expressions of each kind:
# fixed times (the DST special case), hourly and finer.
_ZONES = ["America/New_York", "Europe/Riga", "Australia/Sydney", "Asia/Kolkata"]
_EXPRESSIONS = [
    "30 2 * * *",
    "30 1 * * *",
    "0 0-3 * * *",
    "15,45 1-2 * * 0",
    "0-59 1 * * *",
    "0 * * * *",
    "*/20 1 * * *",
    "*/7 * * * *",
]
_YEAR = (ms(datetime(2024, 1, 1, tzinfo=UTC)), ms(datetime(2025, 1, 1, tzinfo=UTC)))
# Moments near the 2024 DST changes of the zones above, where the quirks are.
_DST_MOMENTS = [
    ms(datetime(2024, 3, 10, 7, tzinfo=UTC)),
    ms(datetime(2024, 11, 3, 6, tzinfo=UTC)),
    ms(datetime(2024, 3, 31, 1, tzinfo=UTC)),
    ms(datetime(2024, 10, 27, 1, tzinfo=UTC)),
    ms(datetime(2024, 4, 6, 16, tzinfo=UTC)),
    ms(datetime(2024, 10, 5, 16, tzinfo=UTC)),
]


@given(
    zone=st.sampled_from(_ZONES),
    expr=st.sampled_from(_EXPRESSIONS),
    moment=st.one_of(
        st.integers(*_YEAR),
        st.builds(
            lambda base, offset: base + offset,
            st.sampled_from(_DST_MOMENTS),
            st.integers(-3 * 3_600_000, 3 * 3_600_000),
        ),
    ),
)
@settings(max_examples=300, deadline=None)
def test_forward_and_backward_agree(zone: str, expr: str, moment: int) -> None:
    ticks = _CronTicks(expr, ZoneInfo(zone))
    before, after = ticks.at_or_before(moment), ticks.after(moment)
    assert before is not None
    assert after is not None
    assert before <= moment < after
    # Nothing between them: they are neighbours in both directions.
    assert ticks.after(before) == after
    assert ticks.at_or_before(after) == after
    assert ticks.at_or_before(after - 1) == before


# -- Schedule -----------------------------------------------------------------


def test_schedule_fields() -> None:
    s = aiogroupq.Schedule(
        "nightly", "report", cron="0 3 * * *", tz="Europe/Paris",
        payload={"kind": "daily"}, group="reports", missed="once",
        max_attempts=5, timeout=timedelta(minutes=10), priority=2, expires=60,
    )  # fmt: skip
    assert (s.name, s.task_type, s.cron, s.every, s.tz) == (
        "nightly", "report", "0 3 * * *", None, "Europe/Paris"
    )  # fmt: skip
    assert (s.group, s.missed, s.max_attempts, s.timeout, s.priority, s.expires) == (
        "reports", "once", 5, 600.0, 2, 60.0
    )  # fmt: skip
    assert aiogroupq.Schedule("b", "t", every=timedelta(seconds=1.5)).every == 1.5
    assert "nightly" in repr(s)


def test_a_run_is_due_at_its_tick_and_carries_the_task_fields() -> None:
    s = aiogroupq.Schedule(
        "nightly", "report", cron="0 3 * * *", payload=[1, 2], group="reports",
        max_attempts=5, timeout=2.5, priority=3, expires=60,
    )  # fmt: skip
    tick = ms(datetime(2024, 6, 1, 3, 0, tzinfo=UTC))
    task = s._new_task(tick)
    assert (task.schedule, task.tick_ms, task.run_at_ms) == ("nightly", tick, tick)
    assert (task.group, task.priority, task.max_attempts) == ("reports", 3, 5)
    assert task.expire_at_ms == tick + 60_000  # counted from the tick
    envelope = unpack(task.envelope)
    assert (envelope.id, envelope.type, envelope.group) == (
        task.id,
        "report",
        "reports",
    )
    assert (envelope.timeout_ms, envelope.enqueued_ms) == (2500, tick)
    assert bytes(envelope.payload) == b"\x92\x01\x02"  # [1, 2] in MessagePack
    assert s._new_task(tick).id != task.id  # a fresh id per attempt to enqueue
    assert aiogroupq.Schedule("b", "t", every=1)._new_task(tick).max_attempts == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "1-200 characters"),
        ({"name": 7}, "1-200 characters"),
        ({}, "exactly one of cron= and every="),
        ({"cron": "* * * * *", "every": 5}, "exactly one of cron= and every="),
        ({"cron": "61 * * * *"}, "'61 * * * *'"),
        ({"cron": "* * *"}, "'* * *'"),
        ({"cron": 5}, "must be a str"),
        ({"cron": "0 0 30 2 *"}, "'0 0 30 2 *'"),  # February has no 30th
        # A sixth field (cronsim reads it as seconds) was taken silently.
        ({"cron": "30 */5 * * * *"}, "has 6 fields; it takes five"),
        ({"cron": "*/10 * * * * *"}, "for ticks under a minute, use every="),
        # every=1e12 said "must be >= 0.1".
        ({"every": 0.05}, "every must be from 0.1 to 31,622,400 seconds"),
        ({"every": 0.0999}, "from 0.1 to"),
        ({"every": 366 * 86_400 + 0.001}, "to 31,622,400 seconds"),
        ({"every": 1e12}, "to 31,622,400 seconds"),
        ({"every": timedelta(days=367)}, "to 31,622,400 seconds"),
        ({"every": float("nan")}, "got nan"),
        ({"every": float("inf")}, "got inf"),
        ({"every": "5"}, "'5'"),
        ({"every": 5, "tz": "Europe/Paris"}, "applies to cron= only"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus"}, "'Mars/Olympus'"),
        ({"cron": "0 * * * *", "tz": 3}, "time zone name"),
        ({"every": 5, "missed": "twice"}, "'twice'"),
    ],
)
def test_schedule_refuses_bad_settings(kwargs: dict[str, object], message: str) -> None:
    args = {"name": "s", **kwargs}
    name = args.pop("name")
    with pytest.raises(aiogroupq.ConfigurationError, match=message.replace("*", r"\*")):
        aiogroupq.Schedule(name, "t", **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"group": ""}, aiogroupq.InvalidGroupError),
        ({"max_attempts": 0}, aiogroupq.InvalidTaskError),
        ({"priority": 10}, aiogroupq.InvalidTaskError),
        ({"timeout": -1}, aiogroupq.InvalidTaskError),
        ({"expires": 0}, aiogroupq.InvalidTaskError),
        ({"payload": object()}, aiogroupq.UnencodablePayloadError),
    ],
)
def test_schedule_refuses_bad_task_fields_as_enqueue_would(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        aiogroupq.Schedule("s", "t", every=1, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.InvalidTaskError):
        aiogroupq.Schedule("s", "", every=1)


def test_cron_without_cronsim_says_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cronsim", None)  # import now fails
    with pytest.raises(aiogroupq.ConfigurationError, match=r"aiogroupq\[cron\]"):
        aiogroupq.Schedule("s", "t", cron="0 * * * *")
    aiogroupq.Schedule("s", "t", every=60)  # intervals need nothing


async def _noop() -> None:
    pass


@pytest.mark.parametrize(
    ("schedules", "message"),
    [
        ([aiogroupq.Schedule("a", "t", every=1)] * 2, "two schedules are named 'a'"),
        ([aiogroupq.Schedule("a", "other", every=1)], "'other', which has no handler"),
        (["a"], "aiogroupq.Schedule items"),
        (aiogroupq.Schedule("a", "t", every=1), "a list of aiogroupq.Schedule"),
    ],
)
def test_consumer_refuses_bad_schedules(schedules: object, message: str) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match=message):
        aiogroupq.Consumer(
            "redis://localhost", queue="q", handlers={"t": _noop},
            schedules=schedules,  # type: ignore[arg-type]
        )  # fmt: skip


def test_consumer_refuses_a_schedule_payload_over_its_limit() -> None:
    big = aiogroupq.Schedule("a", "t", every=1, payload="x" * 2000)
    with pytest.raises(aiogroupq.PayloadTooLargeError):
        aiogroupq.Consumer(
            "redis://localhost", queue="q", handlers={"t": _noop},
            schedules=[big], max_payload_bytes=1000,
        )  # fmt: skip


# -- the policy: what is due when ------------------------------------------------

S = 1000  # one tick a second below


def _due(missed: str, *, start: int, cursor: int, now: int) -> list[int]:
    schedule = aiogroupq.Schedule("s", "t", every=1, missed=missed)  # type: ignore[arg-type]
    return Scheduler(Partitions("q"), [schedule])._due(schedule, start, cursor, now)


@pytest.mark.parametrize("missed", ["skip", "once"])
def test_nothing_is_due_between_ticks(missed: str) -> None:
    assert _due(missed, start=0, cursor=10 * S, now=10 * S + 999) == []


def test_ticks_missed_before_start_follow_the_missed_policy() -> None:
    # The last tick enqueued was 5 s ago; this consumer starts now.
    state = {"start": 10 * S + 300, "cursor": 5 * S, "now": 10 * S + 300}
    assert _due("skip", **state) == []
    assert _due("once", **state) == [10 * S]  # the latest missed one, once
    # A tick that passes after the start is not missed: it runs either way.
    later = {**state, "now": 11 * S + 5}
    assert _due("skip", **later) == [11 * S]
    assert _due("once", **later) == [10 * S, 11 * S]


@pytest.mark.parametrize("missed", ["skip", "once"])
def test_late_ticks_of_a_running_consumer_each_run_once(missed: str) -> None:
    # A stall of 3.5 s while running: every tick of it is enqueued, late.
    assert _due(missed, start=0, cursor=10 * S, now=13 * S + 500) == [
        11 * S, 12 * S, 13 * S,
    ]  # fmt: skip


@pytest.mark.parametrize("missed", ["skip", "once"])
def test_far_behind_only_the_last_minute_is_caught_up(missed: str) -> None:
    due = _due(missed, start=0, cursor=10 * S, now=1000 * S)
    assert due == list(range(941 * S, 1001 * S, S))  # 60 ticks, not 990


def test_far_behind_with_no_tick_in_the_last_minute_the_latest_runs() -> None:
    hour = 3600 * S
    schedule = aiogroupq.Schedule("s", "t", every=3600)
    scheduler = Scheduler(Partitions("q"), [schedule])
    due = scheduler._due(schedule, 0, hour, 5 * hour + 120 * S)
    assert due == [5 * hour]


# -- against Redis, in one process --------------------------------------------


def _ran_key(queue: str) -> str:
    return f"test:ran:{queue}"


def _beat(client: redis.asyncio.Redis, queue: str) -> Callable[[], Awaitable[None]]:
    """A handler that journals its task's id and tick."""

    async def beat() -> None:
        info = aiogroupq.current_task()
        tick = round(info.enqueued_at * 1000)
        await client.rpush(_ran_key(queue), f"{info.id} {tick}")

    return beat


async def _ticks_enqueued(client: redis.asyncio.Redis, queue: str) -> list[int]:
    """The tick of every task enqueued so far, sorted: from the envelopes of
    tasks not yet done, then from the journal of those that ran (a finished
    task's envelope is gone). Keyed by id, so a task is counted once."""
    keys = QueueKeys(queue)
    tick_of: dict[str, int] = {}
    async for key in client.scan_iter(match=keys.pattern()):
        raw = await client.hget(key, "e") if b":t:" in key else None
        if isinstance(raw, bytes):
            envelope = unpack(raw)
            tick_of[envelope.id] = envelope.enqueued_ms
    for line in await _lines(client, _ran_key(queue)):
        task_id, tick = line.split()
        tick_of[task_id] = int(tick)
    return sorted(tick_of.values())


async def _server_ms(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def _until(
    check_: Callable[[], Awaitable[object]], timeout: float = PATIENCE
) -> None:
    with anyio.fail_after(timeout):
        while not await check_():
            await anyio.sleep(0.02)


async def _sleep_until_server(client: redis.asyncio.Redis, target: int) -> None:
    """Sleep until the server's clock reads at least *target* ms."""
    while (now := await _server_ms(client)) < target:
        await anyio.sleep((target - now) / 1000)


async def test_first_start_registers_the_schedule_and_enqueues_no_past_tick(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "sched-first"
    key = QueueKeys(queue).schedule("beat")
    schedule = aiogroupq.Schedule("beat", "beat", every=1, missed="once")
    # Away from a tick boundary, so that the next tick is not due at once.
    now = await _server_ms(redis_client)
    await _sleep_until_server(redis_client, now // S * S + S + 100)
    before = await _server_ms(redis_client)
    async with aiogroupq.Consumer(
        redis_client,
        queue=queue,
        handlers={"beat": _beat(redis_client, queue)},
        schedules=[schedule],
    ):
        registered = int(await redis_client.get(key) or 0)
        # Nothing before the schedule's start ran, "once" or not.
        assert all(t > registered for t in await _ticks_enqueued(redis_client, queue))
        # The next tick is enqueued half a second ahead, due at the tick.
        await _until(lambda: _has_tick(redis_client, queue, before // S * S + S))
    assert before <= registered <= before + S
    assert (await examine(redis_client, QueueKeys(queue))).problems == []


async def _has_tick(client: redis.asyncio.Redis, queue: str, tick: int) -> bool:
    return tick in await _ticks_enqueued(client, queue)


@pytest.mark.slow
@pytest.mark.parametrize("missed", ["skip", "once"])
async def test_ticks_missed_while_no_consumer_ran(
    redis_client: redis.asyncio.Redis, missed: str
) -> None:
    # The scenario needs the restart to land between two ticks; on a loaded
    # machine a sleep may overshoot past the next one, and then it is played
    # again on a fresh queue (a few times at most).
    for attempt in range(3):
        queue = f"sched-missed-{missed}-{attempt}"
        outcome = await _miss_two_ticks(redis_client, queue, missed)
        if outcome is not None:
            break
    else:
        pytest.fail(
            "three restarts in a row came later than the tick they aimed before"
        )
    last, missed_ticks = outcome
    assert missed_ticks == ([] if missed == "skip" else [last + 2 * S])
    assert Counter(await _ticks_enqueued(redis_client, queue)).most_common(1)[0][1] == 1
    assert (await examine(redis_client, QueueKeys(queue))).problems == []


async def _miss_two_ticks(
    redis_client: redis.asyncio.Redis, queue: str, missed: str
) -> tuple[int, list[int]] | None:
    """Run a consumer, stop it for two ticks, start it again 100 ms after the
    second: the last tick before the stop and the missed ticks enqueued at the
    restart, or None when the restart came too late to tell."""
    key = QueueKeys(queue).schedule("beat")
    schedule = aiogroupq.Schedule("beat", "beat", every=1, missed=missed)  # type: ignore[arg-type]

    def consumer() -> aiogroupq.Consumer:
        return aiogroupq.Consumer(
            redis_client,
            queue=queue,
            handlers={"beat": _beat(redis_client, queue)},
            schedules=[schedule],
        )

    async with consumer():
        await _until(lambda: _ticks_enqueued(redis_client, queue))
    last = int(await redis_client.get(key) or 0)
    assert last % S == 0
    await _sleep_until_server(redis_client, last + 2 * S + 100)
    restart = await _server_ms(redis_client)
    async with consumer():
        # Entered: the missed tick, if any, is enqueued by now.
        entered = await _server_ms(redis_client)
        enqueued = await _ticks_enqueued(redis_client, queue)
        missed_ticks = [t for t in enqueued if last < t <= restart]
        # The schedule goes on: the next tick after the restart is enqueued.
        await _until(lambda: _has_tick(redis_client, queue, last + 3 * S))
    print(  # noqa: T201 - the figures this test reports
        f"missed={missed}: last {last}, restart {restart}, entered {entered}, "
        f"enqueued {missed_ticks}"
    )
    # Else the tick at last + 3 s was missed too, and is the one to run once.
    if entered >= last + 3 * S:
        return None
    return last, missed_ticks


@pytest.mark.slow
async def test_a_grouped_schedule_never_overlaps_and_runs_in_tick_order(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "sched-group"
    journal = "sched-group:journal"

    async def slow() -> None:
        tick = round(aiogroupq.current_task().enqueued_at * 1000)
        await redis_client.rpush(journal, f"start {tick}")
        await anyio.sleep(0.25)  # longer than the interval: runs would overlap
        await redis_client.rpush(journal, f"end {tick}")

    schedule = aiogroupq.Schedule("slow", "slow", every=0.1, group="slow")
    consumers = [
        aiogroupq.Consumer(
            redis_client, queue=queue, handlers={"slow": slow}, schedules=[schedule],
            grace_period=5.0,
        )
        for _ in range(2)
    ]  # fmt: skip
    async with consumers[0], consumers[1]:
        await _until(lambda: _count(redis_client, journal, "end", 4))
    events = [line.split() for line in await _lines(redis_client, journal)]
    running, starts = 0, []
    for kind, tick in events:
        running += 1 if kind == "start" else -1
        assert running in (0, 1), events  # never two runs at once
        if kind == "start":
            starts.append(int(tick))
    enqueued = len(await _ticks_enqueued(redis_client, queue))
    print(f"{len(starts)} runs of {enqueued} ticks enqueued")  # noqa: T201
    assert starts == sorted(starts)
    assert len(set(starts)) == len(starts)
    assert (await examine(redis_client, QueueKeys(queue))).problems == []


async def _lines(client: redis.asyncio.Redis, key: str) -> list[str]:
    lines = await client.lrange(key, 0, -1)
    return [x.decode() if isinstance(x, bytes) else x for x in lines]


async def _count(
    client: redis.asyncio.Redis, key: str, prefix: str, at_least: int
) -> bool:
    lines = await _lines(client, key)
    return sum(1 for line in lines if line.startswith(prefix)) >= at_least


async def test_a_damaged_tick_value_is_logged_and_replaced(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queue = "sched-garbage"
    key = QueueKeys(queue).schedule("beat")
    await redis_client.set(key, "not a tick")
    schedule = aiogroupq.Schedule("beat", "beat", every=0.2)
    with caplog.at_level(logging.ERROR, logger="aiogroupq._schedule"):
        async with aiogroupq.Consumer(
            redis_client,
            queue=queue,
            handlers={"beat": _beat(redis_client, queue)},
            schedules=[schedule],
        ):
            await _until(lambda: _ticks_enqueued(redis_client, queue))
    assert "not a tick" in caplog.text
    assert int(await redis_client.get(key) or 0) % 200 == 0


async def test_a_wrong_typed_tick_key_does_not_stop_the_consumer(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    queue = "sched-wrongtype"
    await redis_client.rpush(QueueKeys(queue).schedule("beat"), "x")
    done = anyio.Event()

    async def work() -> None:
        done.set()

    schedule = aiogroupq.Schedule("beat", "beat", every=0.2)
    with caplog.at_level(logging.WARNING, logger="aiogroupq._schedule"):
        async with aiogroupq.Consumer(
            redis_client, queue=queue, handlers={"beat": _noop, "work": work},
            schedules=[schedule],
        ):  # fmt: skip
            async with aiogroupq.Producer(redis_client, queue=queue) as producer:
                await producer.enqueue("work")
            with anyio.fail_after(PATIENCE):
                await done.wait()
    assert "schedule 'beat'" in caplog.text
    assert "WRONGTYPE" in caplog.text


# -- several worker processes -------------------------------------------------


@pytest.mark.slow
async def test_three_worker_processes_enqueue_each_tick_exactly_once(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    spawn: Spawn,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SCHEDULE_APP_REDIS_URL", redis_url)  # for the handler
    queue = "sched-three"
    every = round(schedule_app.EVERY * 1000)
    args = ["worker", "tests.schedule_app:handlers", "--queue", queue]
    workers = [spawn(*args, "--redis-url", redis_url) for _ in range(3)]
    for worker in workers:
        await worker.wait_for_output("worker ready")
    first = await _server_ms(redis_client)
    await anyio.sleep(3.0)  # a bounded run: about 15 ticks
    last = await _server_ms(redis_client)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert await worker.wait() == 0, worker.output
    # A run enqueued ahead of its tick may still wait: run what is left.
    async with aiogroupq.Consumer(
        redis_client, queue=queue, handlers=schedule_app.handlers
    ):
        await _until(lambda: _all_ran(redis_client, queue), timeout=PATIENCE)
    runs = [line.split() for line in await _lines(redis_client, schedule_app.RUNS_KEY)]
    ticks = sorted(int(tick) for tick, *_ in runs)
    by_tick = Counter(ticks)
    by_id = Counter(task_id for _, task_id, *_ in runs)
    pids = Counter(pid for _, _, pid, _ in runs)
    late = sorted(int(started) - int(tick) for tick, _, _, started in runs)
    print(  # noqa: T201 - the figures this test reports
        f"{len(ticks)} ticks over {(last - first) / 1000:.2f}s of 3 workers "
        f"(every {every} ms), runs per process {sorted(pids.values())}, "
        f"start after tick: median {late[len(late) // 2]} ms, max {late[-1]} ms"
    )
    assert by_tick.most_common(1)[0][1] == 1, "a tick was enqueued twice"
    assert by_id.most_common(1)[0][1] == 1, "a task ran twice"
    assert all(tick % every == 0 for tick in ticks)
    # No tick missing between the first and the last.
    assert ticks == list(range(ticks[0], ticks[-1] + every, every))
    # The run covers the time all three were up (generous edges: liveness).
    assert ticks[0] <= first + 1000
    assert ticks[-1] >= last - 1000
    assert min(late) >= 0, "a run started before its tick (server clock)"
    assert (await examine(redis_client, QueueKeys(queue))).problems == []


async def _all_ran(client: redis.asyncio.Redis, queue: str) -> bool:
    # A task's hash stays (for the retention window) after it ran.
    tasks = [k async for k in client.scan_iter(match=QueueKeys(queue).task("*"))]
    return await client.llen(schedule_app.RUNS_KEY) >= len(tasks) > 0


async def test_worker_refuses_a_schedules_attribute_that_is_not_a_list(
    spawn: Spawn,
) -> None:
    proc = spawn(
        "worker", "tests.schedule_app:broken.handlers", "--queue", "q",
        "--redis-url", "redis://127.0.0.1:1/0",
    )  # fmt: skip
    assert await proc.wait() == 2
    lines = proc.output.strip().splitlines()
    assert len(lines) == 1, proc.output
    assert "tests.schedule_app:broken.schedules must be a list" in lines[0]


@pytest.mark.parametrize(
    "every", [0.1, timedelta(milliseconds=100), 366 * 86_400, timedelta(days=366)]
)
def test_every_takes_both_ends_of_its_range(every: float | timedelta) -> None:
    schedule = aiogroupq.Schedule("s", "t", every=every)
    seconds = every.total_seconds() if isinstance(every, timedelta) else every
    print(f"every={every!r}: {schedule.every} s")  # noqa: T201
    assert schedule.every == seconds
    assert _schedule.MIN_EVERY == 0.1
    assert _schedule.MAX_EVERY == 366 * 86_400
