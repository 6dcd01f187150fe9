"""Group-wide operations: ``Admin.cancel_group`` and ``Admin.purge_group``,
their command-line and dashboard forms.

Consumers are real processes (``tests/_journal.py``) where the tasks run;
states are read back with ``Producer.status_many`` and the queue is checked
with ``check_queue`` after each operation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq.dashboard import create_app
from tests._web import serving

from ._journal import Entry, Job, Journal, Options, consumer_processes
from .test_cli_ops import cli
from .test_dashboard import TOKEN, act, browser, login, text

LIVENESS = 60.0
LEASE_MS = 60_000


async def _enqueue(
    producer: aiogroupq.Producer, jobs: Sequence[Job], **options: Any
) -> list[str]:
    tasks = [aiogroupq.Task("work", job, group=job.group, **options) for job in jobs]
    ids: list[str] = []
    for start in range(0, len(tasks), 500):
        ids += await producer.enqueue_many(tasks[start : start + 500])
    return ids


async def _until(
    producer: aiogroupq.Producer, task_id: str, state: str, *, within: float = LIVENESS
) -> None:
    with anyio.fail_after(within):
        while await producer.status(task_id) != state:
            await anyio.sleep(0.02)


async def _until_all(
    producer: aiogroupq.Producer, ids: Sequence[str], state: str
) -> None:
    """Every task of *ids* reaches *state* (a handler's journal line comes
    before its consumer records the outcome)."""
    with anyio.fail_after(LIVENESS):
        while set(await producer.status_many(ids)) != {state}:
            await anyio.sleep(0.05)


def _starts(entries: Sequence[Entry], group: str) -> list[int]:
    return [e.n for e in entries if e.event == "start" and e.group == group]


async def _clean(redis: Any, queue: str, *, busy: bool = False) -> None:
    """The check finds no problem; on a *busy* queue (consumers at work) its
    reads are no one snapshot, so a problem must last over a few checks."""
    for _ in range(10 if busy else 1):
        if not (problems := await aiogroupq.check_queue(redis, queue)):
            return
        await anyio.sleep(0.2)
    raise AssertionError(problems)


# -- across consumer processes -----------------------------------------------------


@pytest.mark.slow
async def test_cancel_group_cancels_exactly_the_groups_waiting_tasks(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "gops"
    journal = Journal(redis_client)
    async with aiogroupq.Admin(redis_url, queue=queue) as admin:
        await admin.set_group("G", concurrency=2)
    others = [
        Job(n=100 + 10 * g + s, group=f"O{g}", seq=s, sleep_ms=5)
        for g in range(3)
        for s in range(10)
    ] + [Job(n=200 + i, group=None, seq=0, sleep_ms=5) for i in range(10)]
    async with (
        consumer_processes(
            redis_url, queue, processes=3, concurrency=4, retry_backoff=60.0
        ),
        aiogroupq.Producer(redis_url, queue=queue) as producer,
        aiogroupq.Admin(redis_url, queue=queue) as admin,
    ):
        # G's two slots: one running until it is cancelled below (however
        # slow the machine, it holds its slot while the others are counted),
        # one in a retry's backoff; behind them a line; and tasks in their
        # first delay.
        running = await producer.enqueue(
            "work", Job(n=0, group="G", seq=0, sleep_ms=600_000), group="G"
        )
        backoff = await producer.enqueue(
            "work", Job(n=1, group="G", seq=1, fail_until=5), group="G"
        )
        await _until(producer, running, "running")
        await _until(producer, backoff, "delayed")
        parked = await _enqueue(
            producer, [Job(n=2 + i, group="G", seq=2 + i) for i in range(5)]
        )
        delayed = await _enqueue(
            producer,
            [Job(n=10 + i, group="G", seq=10 + i) for i in range(3)],
            delay=3600,
        )
        other_ids = await _enqueue(producer, others)
        waiting = [backoff, *parked, *delayed]
        assert (
            await producer.status_many(waiting)
            == ["delayed"] + ["queued"] * 5 + ["delayed"] * 3
        )

        assert await admin.cancel_group("G") == len(waiting)

        assert await producer.status_many(waiting) == ["cancelled"] * len(waiting)
        assert await producer.status(running) == "running"  # running=False
        assert await admin.cancel_group("G") == 0  # nothing left to cancel
        assert await admin.cancel_group("G", running=True) == 1  # now it
        await _until(producer, running, "cancelled")
        await _clean(redis_url, queue, busy=True)
        # The group takes new tasks, and runs them in order (one at a time
        # now, so that the journal's order is the start order).
        await admin.set_group("G", concurrency=1)
        new = [Job(n=300 + i, group="G", seq=300 + i, sleep_ms=3) for i in range(6)]
        new_ids = await _enqueue(producer, new)
        await _until_all(producer, [*other_ids, *new_ids], "succeeded")
        await _clean(redis_url, queue, busy=True)
    entries = await journal.entries()
    started = _starts(entries, "G")  # 0 and 1 held the two slots at once
    assert sorted(started[:2]) == [0, 1]
    assert started[2:] == [j.n for j in new]
    cancelled_ns = {1, *range(2, 7), 10, 11, 12}
    assert not {e.n for e in entries if e.event == "start"} & (cancelled_ns - {1})
    stats = await _stats(redis_url, queue)
    assert stats.totals["cancelled"] == len(waiting) + 1  # and the running one
    assert (stats.ready, stats.parked, stats.delayed, stats.held) == (0, 0, 0, 0)


async def _stats(redis: Any, queue: str, **kw: Any) -> aiogroupq.QueueStats:
    async with aiogroupq.Admin(redis, queue=queue, **kw) as admin:
        return await admin.stats()


@pytest.mark.slow
async def test_partitioned_queue_running_held_and_paused_groups(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue, parts = "gops-p", 4
    journal = Journal(redis_client)
    async with aiogroupq.Admin(redis_url, queue=queue, partitions=parts) as admin:
        # R: one start an hour, two slots: its second head waits held back.
        await admin.set_group("R", concurrency=2, rate=aiogroupq.Rate(1, 3600))
        await admin.pause_group("P")
    async with (
        consumer_processes(
            redis_url,
            queue,
            processes=2,
            concurrency=4,
            options=Options(partitions=parts, lease_ttl=4.5),
        ),
        aiogroupq.Producer(redis_url, queue=queue, partitions=parts) as producer,
        aiogroupq.Admin(redis_url, queue=queue, partitions=parts) as admin,
    ):
        r_running = await producer.enqueue(
            "work", Job(n=0, group="R", seq=0, sleep_ms=60_000), group="R"
        )
        await _until(producer, r_running, "running")
        r_waiting = await _enqueue(
            producer, [Job(n=1 + i, group="R", seq=1 + i) for i in range(4)]
        )
        with anyio.fail_after(LIVENESS):  # the second head is held back
            while (await admin.group_info("R")).state != "rate_limited":
                await anyio.sleep(0.02)
        p_ids = await _enqueue(
            producer, [Job(n=10 + i, group="P", seq=i) for i in range(3)]
        )
        other = await _enqueue(
            producer, [Job(n=20 + i, group=f"X{i}", seq=0) for i in range(8)]
        )

        assert await admin.cancel_group("R", running=True) == len(r_waiting) + 1
        assert await producer.status_many(r_waiting) == ["cancelled"] * 4
        await _until(producer, r_running, "cancelled", within=10)
        assert await admin.cancel_group("P") == len(p_ids)
        assert await producer.status_many(p_ids) == ["cancelled"] * 3
        assert (await admin.group_settings("P")).paused  # still paused
        # R holds nothing back any more: it no longer counts as rate-limited.
        assert (await admin.stats()).groups_rate_limited == 0
        await _clean(redis_url, queue, busy=True)

        await admin.set_group("R", concurrency=1, rate=False)
        await admin.resume_group("P")
        new = [
            Job(n=30 + 3 * k + i, group=g, seq=i)
            for k, g in enumerate(("R", "P"))
            for i in range(3)
        ]
        new_ids = await _enqueue(producer, new)
        await _until_all(producer, [*other, *new_ids], "succeeded")
        await _clean(redis_url, queue, busy=True)
    entries = await journal.entries()
    assert _starts(entries, "R") == [0, 30, 31, 32]
    assert _starts(entries, "P") == [33, 34, 35]


# -- bounded calls -----------------------------------------------------------------


def _record_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tasks each cancel_group.lua call was given."""
    sizes: list[int] = []
    real = _scripts.cancel_group

    async def spy(*args: Any, **kw: Any) -> _scripts.GroupCancelled:
        line = kw.get("line")
        sizes.append(line[1] if line is not None else len(kw.get("ids", ())))
        return await real(*args, **kw)

    monkeypatch.setattr(_scripts, "cancel_group", spy)
    return sizes


async def test_a_large_group_is_cancelled_over_bounded_calls(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = "gops-big"
    sizes = _record_calls(monkeypatch)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        line: list[str] = []
        for start in range(0, 2300, 500):
            line += await producer.enqueue_many(
                [aiogroupq.Task("t", i, group="B") for i in range(start, start + 500)]
            )
        late: list[str] = []
        keep: list[str] = []
        for _ in range(3):  # each batch shares one due time: ties in the set
            batch = await producer.enqueue_many(
                [aiogroupq.Task("t", i, group="B", delay=3600) for i in range(400)]
                + [aiogroupq.Task("t", i, group="C", delay=3600) for i in range(100)]
            )
            late += batch[:400]
            keep += batch[400:]

        assert await admin.cancel_group("B") == len(line) + len(late)

        assert set(await producer.status_many([*line, *late])) == {"cancelled"}
        assert set(await producer.status_many(keep)) == {"delayed"}
        assert max(sizes) <= _scripts.CANCEL_GROUP_BATCH
        assert len(sizes) >= 4
        stats = await admin.stats()
        assert (stats.ready, stats.parked, stats.delayed) == (0, 0, len(keep))
        assert stats.totals["cancelled"] == len(line) + len(late)
        await _clean(redis_client, queue)
        # The group is empty and takes a task at once.
        fresh = await producer.enqueue("t", 0, group="B")
        assert (await admin.group_info("B")).head is not None
        assert await producer.status(fresh) == "queued"
    await _clean(redis_client, queue)


async def test_delayed_tasks_sharing_a_due_time_beyond_a_chunk_are_all_found(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = "gops-ties"
    monkeypatch.setattr(_scripts, "CANCEL_GROUP_BATCH", 7)
    sizes = _record_calls(monkeypatch)
    later = datetime.now(UTC) + timedelta(days=30)  # one due time for all
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task("t", i, group="B" if i % 3 else "C", run_at=later)
                for i in range(90)
            ]
        )
        mine = [t for i, t in enumerate(ids) if i % 3]
        assert await admin.cancel_group("B") == len(mine)
        assert set(await producer.status_many(mine)) == {"cancelled"}
        assert (await admin.stats()).delayed == 30
        assert max(sizes) <= 7  # ids per call, though the set shifts under it
    await _clean(redis_client, queue)


async def test_a_delayed_task_coming_due_between_calls_is_cancelled_too(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A paused group: an exact cut. Its tasks in their first delay come due
    after the first call and a claim promotes them into the group's line
    (its slot is held) before the next: they are cancelled all the same."""
    queue = "gops-due"
    keys = QueueKeys(queue)
    real = _scripts.cancel_group
    calls = 0

    async def promote_after_the_first_call(
        *args: Any, **kw: Any
    ) -> _scripts.GroupCancelled:
        nonlocal calls
        reply = await real(*args, **kw)
        calls += 1
        if calls == 1:
            await anyio.sleep(0.6)  # past the delay
            claimed = await _scripts.claim(
                redis_client, keys, "c1", k=1, lease_ms=LEASE_MS, scan_limit=50
            )
            assert claimed.tasks == []  # the group is paused
        return reply

    monkeypatch.setattr(_scripts, "cancel_group", promote_after_the_first_call)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        await admin.pause_group("B")
        waiting = [await producer.enqueue("t", i, group="B") for i in range(3)]
        due = [await producer.enqueue("t", i, group="B", delay=0.3) for i in range(3)]

        assert await admin.cancel_group("B") == 6
        assert calls > 1
        assert set(await producer.status_many([*waiting, *due])) == {"cancelled"}
        info = await admin.group_info("B")
        assert (info.head, info.backlog, info.delayed) == (None, 0, 0)
    await _clean(redis_client, queue)


async def test_a_retry_in_its_backoff_passes_its_slot_on_only_after_the_line(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task in a retry's backoff holds the group's slot and sits in the
    delayed set beside the tasks in their first delay. Cancelled with them,
    it would pass its slot to the line's head, which a consumer could claim
    and run before the line is cancelled: a consumer claims after every
    call here, and must find nothing of the group's."""
    queue = "gops-backoff"
    keys = QueueKeys(queue)
    real = _scripts.cancel_group
    taken: list[str] = []

    async def claim_after_each_call(*args: Any, **kw: Any) -> _scripts.GroupCancelled:
        reply = await real(*args, **kw)
        claimed = await _scripts.claim(
            redis_client, keys, "c2", k=5, lease_ms=LEASE_MS, scan_limit=50
        )
        taken.extend(t.id for t in claimed.tasks)
        return reply

    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        first = await producer.enqueue("t", 0, group="B")
        claimed = await _scripts.claim(
            redis_client, keys, "c1", k=1, lease_ms=LEASE_MS, scan_limit=50
        )
        assert [t.id for t in claimed.tasks] == [first]
        retry = _scripts.Outcome(first, claimed.tasks[0].token, "retry", 3_600_000)
        await _scripts.finish(redis_client, keys, [retry], retention_ms=LEASE_MS)
        line = [await producer.enqueue("t", i, group="B") for i in range(1, 4)]
        later = [await producer.enqueue("t", i, group="B", delay=3600) for i in (4, 5)]
        assert await producer.status_many([first, *line, *later]) == (
            ["delayed"] + ["queued"] * 3 + ["delayed"] * 2
        )
        monkeypatch.setattr(_scripts, "cancel_group", claim_after_each_call)

        assert await admin.cancel_group("B") == 6
        assert taken == []
        assert set(await producer.status_many([first, *line, *later])) == {"cancelled"}
    await _clean(redis_client, queue)


# -- halted groups, dead letters, bad input --------------------------------------------


async def _run_once(
    client: redis.asyncio.Redis, keys: QueueKeys, kind: _scripts.OutcomeKind, k: int = 1
) -> list[str]:
    """Claim *k* tasks and end them as *kind* (``dead``, ``halt``, ``ok``)."""
    reply = await _scripts.claim(
        client, keys, "c1", k=k, lease_ms=LEASE_MS, scan_limit=50
    )
    outcomes = [
        _scripts.Outcome(t.id, t.token, kind, "ValueError: bad", "Traceback")
        for t in reply.tasks
    ]
    await _scripts.finish(client, keys, outcomes, retention_ms=LEASE_MS)
    return [t.id for t in reply.tasks]


async def test_purge_group_deletes_only_its_dead_letters_and_a_halt_goes_on(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "gops-dead"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        dead_d = []
        for i in range(3):
            await producer.enqueue("t", i, group="D", max_attempts=1)
            dead_d += await _run_once(redis_client, keys, "dead")
        dead_e = await producer.enqueue("t", 0, group="E", max_attempts=1)
        assert await _run_once(redis_client, keys, "dead") == [dead_e]
        head = await producer.enqueue("t", 0, group="H", max_attempts=1)
        assert await _run_once(redis_client, keys, "halt") == [head]
        behind = [await producer.enqueue("t", i, group="H") for i in range(3)]
        delayed = await producer.enqueue("t", 9, group="H", delay=3600)
        assert (await admin.group_info("H")).state == "halted"

        # A halted group: its line and delayed tasks are cancelled, its dead
        # head stays a dead letter and the group stays halted.
        assert await admin.cancel_group("H") == 4
        assert (
            await producer.status_many([head, *behind, delayed])
            == ["dead"] + ["cancelled"] * 4
        )
        assert (await admin.group_info("H")).state == "halted"
        await _clean(redis_client, queue)
        after = await producer.enqueue("t", 10, group="H")

        assert await admin.purge_group("D") == 3
        assert await producer.status_many([*dead_d, dead_e]) == [None] * 3 + ["dead"]
        assert await admin.purge_group("D") == 0
        # Purging the dead head lets the halted group go on.
        assert await admin.purge_group("H") == 1
        assert await producer.status(head) is None
        assert (await admin.group_info("H")).head is not None
        assert await _run_once(redis_client, keys, "ok") == [after]
        assert (await admin.stats()).dead == 1
    await _clean(redis_client, queue)


async def test_a_damaged_dead_set_is_a_corrupt_queue_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "gops-baddead"
    keys = QueueKeys(queue)
    async with (
        aiogroupq.Producer(redis_client, queue=queue) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        task_id = await producer.enqueue("t", 0, group="D")
        await redis_client.set(keys.dead, "not a zset")
        before = {k: await redis_client.type(k) for k in await redis_client.keys("*")}
        with pytest.raises(aiogroupq.CorruptQueueError, match="dead") as caught:
            await admin.purge_group("D")
        assert keys.dead in str(caught.value)
        after = {k: await redis_client.type(k) for k in await redis_client.keys("*")}
        assert after == before
        assert await producer.status(task_id) == "queued"
    problems = await aiogroupq.check_queue(redis_client, queue)
    assert [(p.kind, p.key) for p in problems] == [("wrong-type", keys.dead)]
    await redis_client.delete(keys.dead)


async def test_bad_input_is_refused_and_unknown_groups_are_zero(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Admin(redis_client, queue="gops-none") as admin:
        for bad in ("", None, 5, "x" * 2000):
            with pytest.raises(aiogroupq.InvalidGroupError):
                await admin.cancel_group(bad)  # type: ignore[arg-type]
            with pytest.raises(aiogroupq.InvalidGroupError):
                await admin.purge_group(bad)  # type: ignore[arg-type]
        with pytest.raises(aiogroupq.ConfigurationError):
            await admin.cancel_group("g", running="yes")  # type: ignore[arg-type]
        # A queue or group that does not exist: nothing to do, nothing written.
        assert await admin.cancel_group("g", running=True) == 0
        assert await admin.purge_group("g") == 0
    assert await redis_client.keys("*") == []


# -- the command line and the dashboard ----------------------------------------------


async def _one_running_three_waiting(
    producer: aiogroupq.Producer, client: redis.asyncio.Redis, keys: QueueKeys
) -> tuple[str, list[str]]:
    """Group g: one task claimed (running), three in its line behind it."""
    first = await producer.enqueue("t", 0, group="g")
    await _scripts.claim(client, keys, "c1", k=1, lease_ms=LEASE_MS, scan_limit=5)
    return first, [await producer.enqueue("t", i, group="g") for i in range(3)]


async def test_cli_cancels_and_purges_a_group(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "ops"
    keys = QueueKeys(queue)
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        first, waiting = await _one_running_three_waiting(producer, redis_client, keys)
        gone = await producer.enqueue("t", 0, group="d", max_attempts=1)
        assert await _run_once(redis_client, keys, "dead") == [gone]

        # Without --yes it only says what it would do.
        run = await cli("cancel", "--group", "g", url=redis_url, queue=queue)
        assert run.code == 1, run
        assert "(3 tasks now): add --yes" in run.err
        assert await producer.status_many(waiting) == ["queued"] * 3
        run = await cli("cancel", "--group", "g", "--yes", url=redis_url, queue=queue)
        assert run.code == 0, run
        assert "cancelled 3 tasks of group 'g'" in run.out
        assert await producer.status_many(waiting) == ["cancelled"] * 3
        assert await producer.status(first) == "running"
        run = await cli("cancel", "--group", "g", url=redis_url, queue=queue)
        assert run.code == 1
        assert "nothing to cancel" in run.err
        run = await cli(
            "cancel", "--group", "g", "--running", url=redis_url, queue=queue
        )
        assert (run.code, "and 1 running): add --yes" in run.err) == (1, True), run
        run = await cli(
            "cancel", "--group", "g", "--running", "--yes", url=redis_url, queue=queue
        )
        assert run.code == 0, run
        assert "cancelled 1 task of group 'g'" in run.out
        assert await redis_client.hget(keys.task(first), "cx") == b"1"

        run = await cli("dead", "purge", "--group", "d", url=redis_url, queue=queue)
        assert (run.code, "add --yes" in run.err) == (1, True), run
        assert await producer.status(gone) == "dead"
        run = await cli(
            "dead", "purge", "--group", "d", "--yes", url=redis_url, queue=queue
        )
        assert run.code == 0, run
        assert "purged 1 dead letters of group 'd'" in run.out
        assert await producer.status(gone) is None

        for argv, code, said in (
            (("cancel", "x", "--group", "g"), 2, "not both"),
            (("cancel", "--running"), 2, "a task id or --group"),
            (("cancel", "--group", "nope"), 1, "no live tasks"),
            (("dead", "purge", "--group", "d", "--all"), 2, "one of them"),
            (("dead", "purge", "--group", "d", "--yes"), 1, "no dead letters"),
        ):
            run = await cli(*argv, url=redis_url, queue=queue)
            assert (run.code, said in run.err) == (code, True), run
        run = await cli("cancel", "--group", "g", url=redis_url, queue="nothing")
        assert (run.code, "does not exist" in run.err) == (1, True), run
        # Stored bytes are escaped on a terminal.
        run = await cli("cancel", "--group", "\x1b[31mx", url=redis_url, queue=queue)
        assert run.code == 1, run
        assert "\x1b" not in run.err
    await _clean(redis_client, queue)


async def test_dashboard_group_page_cancels_and_purges(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    queue = "dash"
    keys = QueueKeys(queue)
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        first, waiting = await _one_running_three_waiting(producer, redis_client, keys)
        with serving(create_app(redis_url, queues=[queue], token=TOKEN)) as url:
            async with browser(url) as client:
                await login(client)
                page = await client.get(f"/q/{queue}/group", params={"name": "g"})
                assert "Cancel all queued tasks" in page.text
                assert "Purge dead letters" in page.text

                unconfirmed = await act(client, f"/q/{queue}/task/cancel", group="g")
                shown = await client.get(unconfirmed.headers["location"])
                assert "confirmation box" in text(shown.text)
                assert await producer.status(waiting[0]) == "queued"

                done = await act(
                    client, f"/q/{queue}/task/cancel", group="g", confirm="yes"
                )
                shown = await client.get(done.headers["location"])
                assert "cancelled 3 tasks of group" in text(shown.text)
                assert await producer.status_many(waiting) == ["cancelled"] * 3
                assert await producer.status(first) == "running"
                done = await act(
                    client,
                    f"/q/{queue}/task/cancel",
                    group="g",
                    running="1",
                    confirm="yes",
                )
                assert await redis_client.hget(keys.task(first), "cx") == b"1"

                dead = await producer.enqueue("t", 1, group="h", max_attempts=1)
                assert await _run_once(redis_client, keys, "dead") == [dead]
                unconfirmed = await act(client, f"/q/{queue}/dead/purge", group="h")
                shown = await client.get(unconfirmed.headers["location"])
                assert "confirmation box" in text(shown.text)
                assert await producer.status(dead) == "dead"
                done = await act(
                    client, f"/q/{queue}/dead/purge", group="h", confirm="yes"
                )
                shown = await client.get(done.headers["location"])
                assert "purged 1 dead letters of group" in text(shown.text)
                assert await producer.status(dead) is None

                # A form without the page's CSRF token is refused.
                forged = await client.post(
                    f"/q/{queue}/task/cancel",
                    data={"csrf": "forged", "group": "g", "confirm": "yes"},
                )
                assert forged.status_code == 403
        # Read-only: no forms, and the actions are refused.
        late = await producer.enqueue("t", 9, group="g")
        app = create_app(redis_url, queues=[queue], token=TOKEN, read_only=True)
        with serving(app) as url:
            async with browser(url) as client:
                await login(client)
                page = await client.get(f"/q/{queue}/group", params={"name": "g"})
                assert page.status_code == 200
                assert "Cancel all queued tasks" not in page.text
                refused = await act(
                    client, f"/q/{queue}/task/cancel", group="g", confirm="yes"
                )
                assert refused.status_code == 403
        assert await producer.status(late) == "queued"
    await _clean(redis_client, queue)
