"""``aiogroupq.testing``: run_inline, drain, the journal and its order check."""

from __future__ import annotations

import random
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq.testing import (
    DrainTimeoutError,
    GroupOrderError,
    Journal,
    JournalEntry,
    PayloadDecodeError,
    ResultEncodeError,
    assert_group_order,
    drain,
    run_inline,
)

QUEUE = "testing"


class ImportRequest(msgspec.Struct):
    tenant: int
    rows: list[str]


async def import_rows(request: ImportRequest) -> int:
    info = aiogroupq.current_task()
    assert info.group == f"{request.tenant}:orders"
    return len(request.rows)


# -- run_inline ------------------------------------------------------------------


async def test_run_inline_decodes_like_a_consumer_and_sets_the_task() -> None:
    seen: list[aiogroupq.TaskInfo] = []

    async def handler(request: ImportRequest) -> list[str]:
        seen.append(aiogroupq.current_task())
        return request.rows

    result = await run_inline(
        handler,
        {"tenant": 7, "rows": ("a", "b")},  # a tuple comes back a list
        task_type="import_rows",
        task_id="t-1",
        group="7:orders",
        attempt=2,
        max_attempts=5,
    )
    assert result == ["a", "b"]
    (info,) = seen
    assert (info.id, info.type, info.group) == ("t-1", "import_rows", "7:orders")
    assert (info.attempt, info.max_attempts, info.fencing_token) == (2, 5, 1)
    with pytest.raises(RuntimeError, match="outside a task handler"):
        aiogroupq.current_task()


async def test_run_inline_gives_builtins_to_an_unannotated_handler() -> None:
    async def handler(payload):  # type: ignore[no-untyped-def]
        return payload

    assert await run_inline(handler, ImportRequest(1, ["x"])) == {
        "tenant": 1,
        "rows": ["x"],
    }

    async def no_payload() -> str:
        return aiogroupq.current_task().type

    assert await run_inline(no_payload, None, task_type="tick") == "tick"


async def test_run_inline_lets_the_handlers_exceptions_through() -> None:
    async def retry(payload: int) -> None:
        raise aiogroupq.Retry(delay=3.0)

    with pytest.raises(aiogroupq.Retry) as caught:
        await run_inline(retry, 1)
    assert caught.value.delay == 3.0

    async def fail(payload: int) -> None:
        raise LookupError(payload)

    with pytest.raises(LookupError):
        await run_inline(fail, 1)


async def test_run_inline_applies_the_handlers_timeout() -> None:
    async def slow(payload: int) -> None:
        await anyio.sleep(10)

    with pytest.raises(TimeoutError, match=r"timeout of 0\.05s"):
        await run_inline(aiogroupq.Handler(slow, timeout=0.05), 1)
    with pytest.raises(TimeoutError, match=r"timeout of 0\.05s"):
        await run_inline(slow, 1, timeout=0.05)


async def test_run_inline_refuses_what_a_producer_or_consumer_would() -> None:
    with pytest.raises(aiogroupq.UnencodablePayloadError):
        await run_inline(import_rows, object())
    with pytest.raises(aiogroupq.InvalidGroupError):
        await run_inline(import_rows, {}, group="")
    with pytest.raises(aiogroupq.InvalidTaskError, match="attempt"):
        await run_inline(import_rows, {}, attempt=0)

    def not_async(payload: int) -> None: ...

    with pytest.raises(aiogroupq.ConfigurationError, match="must be an async"):
        await run_inline(not_async, 1)  # type: ignore[arg-type]

    async def unstorable(payload: int) -> object:
        return object()

    with pytest.raises(ResultEncodeError, match="UnencodableResult"):
        await run_inline(aiogroupq.Handler(unstorable, store_result=True), 1)
    assert isinstance(await run_inline(unstorable, 1), object)  # not stored: fine


async def test_a_bad_payload_fails_inline_with_the_consumers_reason(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The reason run_inline gives is the dead-letter reason a real consumer
    records for the same payload."""
    bad = {"tenant": "seven", "rows": []}
    with pytest.raises(PayloadDecodeError) as caught:
        await run_inline(import_rows, bad, task_type="import_rows")
    assert caught.value.reason.startswith(
        "InvalidPayload: payload does not decode into ImportRequest"
    )
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("import_rows", bad)
    (outcome,) = await drain(
        redis_client, queue=QUEUE, handlers={"import_rows": import_rows}
    )
    assert (outcome.id, outcome.state) == (task_id, aiogroupq.TaskState.DEAD)
    assert outcome.reason == caught.value.reason
    assert outcome.attempts == 1


# -- drain -------------------------------------------------------------------------


async def test_drain_reports_every_outcome(redis_client: redis.asyncio.Redis) -> None:
    fails_left = {"flaky": 1}

    async def flaky(payload: str) -> str:
        if fails_left[payload]:
            fails_left[payload] -= 1
            raise ConnectionError("try again")
        return payload.upper()

    async def broken(payload: str) -> None:
        raise ValueError(f"boom {payload}")

    async def later(payload: int) -> None:
        if aiogroupq.current_task().attempt == 1:
            raise aiogroupq.Retry(delay=0.05)

    handlers: dict[str, Any] = {
        "import_rows": import_rows,
        "flaky": flaky,
        "broken": broken,
        "later": later,
    }
    dead_letters: list[aiogroupq.DeadLetter] = []

    async def on_dead(letter: aiogroupq.DeadLetter) -> None:
        dead_letters.append(letter)

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            [
                aiogroupq.Task(
                    "import_rows", ImportRequest(4, ["a", "b"]), group="4:orders"
                ),
                aiogroupq.Task("flaky", "flaky", group="g"),
                aiogroupq.Task("broken", "x", group="g", max_attempts=2),
                aiogroupq.Task("later", 1),
            ]
        )
    outcomes = await drain(
        redis_client,
        queue=QUEUE,
        handlers=handlers,
        retry_backoff=0.01,
        on_dead=on_dead,
    )
    by_id = {o.id: o for o in outcomes}
    assert sorted(by_id) == sorted(ids)
    ok, flaky_, broken_, later_ = (by_id[i] for i in ids)
    succeeded = aiogroupq.TaskState.SUCCEEDED
    assert (ok.state, ok.result, ok.attempts, ok.reason) == (succeeded, 2, 1, None)
    assert (ok.type, ok.group) == ("import_rows", "4:orders")
    assert (flaky_.state, flaky_.result, flaky_.attempts) == (succeeded, "FLAKY", 2)
    assert flaky_.error is None  # the last run succeeded
    assert broken_.state == aiogroupq.TaskState.DEAD
    assert broken_.attempts == 2
    assert broken_.reason == "ValueError: boom x"
    assert isinstance(broken_.error, ValueError)
    assert (later_.state, later_.attempts) == (succeeded, 2)
    assert [letter.id for letter in dead_letters] == [broken_.id]


async def test_drain_waits_for_prioritised_tasks_too(
    redis_client: redis.asyncio.Redis,
) -> None:
    """Once a queue uses priorities its runnable tasks wait in another key;
    drain must not mistake the queue for idle."""

    async def work(payload: int) -> None:
        await anyio.sleep(0.01)

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue_many(
            aiogroupq.Task("work", n, priority=n % 3 * 4) for n in range(30)
        )
    outcomes = await drain(
        redis_client, queue=QUEUE, handlers={"work": work}, concurrency=2
    )
    assert len(outcomes) == 30
    assert {o.state for o in outcomes} == {aiogroupq.TaskState.SUCCEEDED}


async def test_drain_keeps_group_order(redis_client: redis.asyncio.Redis) -> None:
    rng = random.Random(7)

    async def work(payload: int) -> None:
        await anyio.sleep(rng.random() / 200)

    journal = Journal()
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            aiogroupq.Task("work", n, group=rng.choice("abc") if n % 5 else None)
            for n in range(120)
        )
    outcomes = await drain(
        redis_client,
        queue=QUEUE,
        handlers=journal.wrap_handlers({"work": work}),
        concurrency=16,
    )
    assert len(outcomes) == 120
    assert {o.state for o in outcomes} == {aiogroupq.TaskState.SUCCEEDED}
    assert_group_order(journal, enqueued=ids)
    groups = {o.id: o.group for o in outcomes}
    for group in "abc":
        assert journal.started(group) == [i for i in ids if groups[i] == group]


async def test_drain_leaves_delayed_tasks_unless_asked(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def work(payload: int) -> int:
        return payload

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        now = await producer.enqueue("work", 1)
        # Due long after any drain, however slow the machine.
        later = await producer.enqueue("work", 2, delay=3600)
        outcomes = await drain(redis_client, queue=QUEUE, handlers={"work": work})
        assert [o.id for o in outcomes] == [now]
        assert await producer.status(later) == aiogroupq.TaskState.DELAYED
        assert await producer.cancel(later)
        # Waited for, whether it is due by the time the drain begins or not.
        soon = await producer.enqueue("work", 3, delay=0.3)
        outcomes = await drain(
            redis_client, queue=QUEUE, handlers={"work": work}, wait_delayed=True
        )
        assert [(o.id, o.result) for o in outcomes] == [(soon, 3)]


async def test_drain_does_not_wait_for_a_halted_group(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def fail(payload: int) -> None:
        raise RuntimeError("no")

    handlers = {"work": aiogroupq.Handler(fail, on_dead="halt")}
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        first, second = await producer.enqueue_many(
            [aiogroupq.Task("work", n, group="g", max_attempts=1) for n in (1, 2)]
        )
        outcomes = await drain(redis_client, queue=QUEUE, handlers=handlers)
        assert [(o.id, o.state) for o in outcomes] == [
            (first, aiogroupq.TaskState.DEAD)
        ]
        assert await producer.status(second) == aiogroupq.TaskState.QUEUED


async def test_drain_times_out_with_what_was_left(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def stuck(payload: int) -> None:
        await anyio.sleep(60)

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("stuck", 1)
    with anyio.fail_after(30):  # liveness: the drain and its consumer end
        with pytest.raises(DrainTimeoutError, match="1 running") as caught:
            await drain(
                redis_client,
                queue=QUEUE,
                handlers={"stuck": stuck},
                # Long enough for the claim to happen on a stalled machine:
                # the task must be running, not still ready, when it ends.
                timeout=5.0,
                grace_period=0.1,
            )
    (outcome,) = caught.value.outcomes
    assert outcome.id == task_id
    assert outcome.state == aiogroupq.TaskState.RUNNING


async def test_drain_refuses_bad_handlers_like_a_consumer(
    redis_client: redis.asyncio.Redis,
) -> None:
    def not_async(payload: int) -> None: ...

    with pytest.raises(aiogroupq.ConfigurationError, match=r"handler for 'x' must"):
        await drain(redis_client, queue=QUEUE, handlers={"x": not_async})  # type: ignore[dict-item]
    with pytest.raises(aiogroupq.ConfigurationError, match="queue name"):
        await drain(redis_client, queue="bad queue", handlers={"x": import_rows})


# -- the journal's check -------------------------------------------------------------


def _entries(*events: tuple[str, str, str | None, int]) -> list[JournalEntry]:
    return [
        JournalEntry(seq, "start" if kind == "s" else "end", task, "t", group, attempt)
        for seq, (kind, task, group, attempt) in enumerate(events)
    ]


def test_the_order_check_accepts_a_retry_before_later_tasks() -> None:
    entries = _entries(
        ("s", "a1", "a", 1),
        ("s", "u", None, 1),  # ungrouped: ignored
        ("e", "a1", "a", 1),
        ("s", "a1", "a", 2),  # retried, before a2
        ("e", "a1", "a", 2),
        ("s", "a2", "a", 1),
        ("e", "a2", "a", 1),
        ("e", "u", None, 1),
    )
    assert_group_order(entries, enqueued=["a1", "u", "a2"])


def test_the_order_check_names_each_violation() -> None:
    entries = _entries(
        ("s", "a2", "a", 1),
        ("e", "a2", "a", 1),
        ("s", "a1", "a", 1),  # overtaken by a2
        ("s", "a3", "a", 1),  # while a1 runs
        ("e", "a1", "a", 1),
        ("e", "a3", "a", 1),
        ("s", "zz", "b", 1),  # not enqueued
        ("e", "zz", "b", 1),
    )
    with pytest.raises(GroupOrderError) as caught:
        assert_group_order(entries, enqueued=["a1", "a2", "a3"])
    problems = caught.value.problems
    assert len(problems) == 3, problems
    assert problems[0] == (
        "group 'a': task 'a1' (attempt 1), enqueued #0, started at event 2 "
        "after task 'a2', enqueued #1, had started at event 0"
    )
    assert problems[1] == (
        "group 'a': task 'a3' (attempt 1) started at event 3 while task 'a1', "
        "started at event 2, was still running"
    )
    assert "'zz'" in problems[2]
    assert "not among the enqueued ids" in problems[2]
    assert str(caught.value).startswith("group order broken (3 problems):\n  ")
    assert isinstance(caught.value, AssertionError)


def test_a_retry_after_a_later_task_is_a_violation() -> None:
    entries = _entries(
        ("s", "a1", "a", 1),
        ("e", "a1", "a", 1),
        ("s", "a2", "a", 1),
        ("e", "a2", "a", 1),
        ("s", "a1", "a", 2),  # the retry ran after a2: strict order broken
        ("e", "a1", "a", 2),
    )
    journal = Journal()
    journal.entries.extend(entries)
    (problem,) = journal.problems(["a1", "a2"])
    assert "task 'a1' (attempt 2)" in problem


async def test_a_dead_letter_whose_on_dead_comes_late_still_has_its_state(
    redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The consumer calls on_dead once the outcome is recorded, so the drain's
    # idle check can see the queue idle before the drain hears of the letter.
    from aiogroupq._work.outcomes import Outcomes

    real = Outcomes._call_on_dead

    async def late(self: Outcomes, notice: aiogroupq.DeadLetter) -> None:
        await anyio.sleep(0.2)
        await real(self, notice)

    monkeypatch.setattr(Outcomes, "_call_on_dead", late)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("import_rows", {"tenant": "x", "rows": []})
    (outcome,) = await drain(
        redis_client,
        queue=QUEUE,
        handlers={"import_rows": import_rows},
        poll_interval=0.001,
    )
    assert (outcome.id, outcome.state) == (task_id, aiogroupq.TaskState.DEAD)
    assert outcome.reason is not None


async def test_run_inline_runs_a_batch_handler_on_a_list_of_payloads() -> None:
    seen: list[list[str]] = []

    async def rows(batch: list[ImportRequest]) -> list[int]:
        seen.append([info.id for info in aiogroupq.current_batch()])
        assert aiogroupq.current_task().id == seen[-1][0]
        return [len(r.rows) for r in batch]

    handler = aiogroupq.Handler(rows, batch_size=3, store_result=True)
    one = {"tenant": 1, "rows": ["a", "b"]}
    two = {"tenant": 2, "rows": ["c"]}
    got = await run_inline(handler, [one, two], task_id="t-1", group="g")
    assert got == [2, 1]
    assert len(seen[0]) == 2
    assert seen[0][0] == "t-1"
    for bad in (one, [], [one] * 4, "rows"):
        with pytest.raises(aiogroupq.InvalidTaskError, match="list of 1 to 3"):
            await run_inline(handler, bad)
    with pytest.raises(PayloadDecodeError):
        await run_inline(handler, [one, {"tenant": "seven", "rows": []}])

    async def short(batch: list[ImportRequest]) -> list[int]:
        return [1]

    with pytest.raises(ResultEncodeError, match="one result per task"):
        await run_inline(
            aiogroupq.Handler(short, batch_size=3, store_result=True), [one, two]
        )


async def test_run_inline_lets_batch_failed_through_as_raised() -> None:
    async def rows(batch: list[int]) -> None:
        raise aiogroupq.BatchFailed(1, ValueError(f"bad {batch[1]}"))

    with pytest.raises(aiogroupq.BatchFailed) as caught:
        await run_inline(aiogroupq.Handler(rows, batch_size=3), [10, 11, 12])
    assert caught.value.done == 1
    assert str(caught.value.error) == "bad 11"


@pytest.mark.parametrize("done", [0, 1, 2, 4, 5, 7])
async def test_drain_reports_each_task_of_a_batch_that_failed_part_way(
    redis_client: redis.asyncio.Redis, done: int
) -> None:
    """BatchFailed(done=k) on a batch of 5: the first k succeeded with no
    result, the next one failed (dead: one attempt), the rest went back
    unjudged and ran in the next batch; each outcome says so."""
    calls: list[list[int]] = []

    async def rows(batch: list[int]) -> list[str]:
        calls.append(batch)
        if len(calls) == 1:
            raise aiogroupq.BatchFailed(done, ValueError(f"bad {done}"))
        return [f"r{n}" for n in batch]

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            [aiogroupq.Task("rows", n, group="g", max_attempts=1) for n in range(5)]
        )
    outcomes = await drain(
        redis_client,
        queue=QUEUE,
        handlers={"rows": aiogroupq.Handler(rows, batch_size=5)},
        retry_backoff=0.01,
    )
    assert calls[0] == [0, 1, 2, 3, 4], calls
    assert calls[1:] == ([list(range(done + 1, 5))] if done < 4 else []), calls
    by_id = {o.id: o for o in outcomes}
    got = []
    for n, task_id in enumerate(ids):
        o = by_id[task_id]
        error = None if o.error is None else f"{type(o.error).__name__}: {o.error}"
        got.append((n, o.state, o.attempts, o.result, error))
    succeeded, dead = aiogroupq.TaskState.SUCCEEDED, aiogroupq.TaskState.DEAD
    want = [
        (n, succeeded, 1, None, None)
        if n < done
        else (n, dead, 1, None, f"ValueError: bad {done}")
        if n == done
        else (n, succeeded, 1, f"r{n}", None)
        for n in range(5)
    ]
    assert got == want, (
        f"BatchFailed(done={done}): the first {done} succeeded, task {done} "
        f"failed, the rest ran again"
    )
