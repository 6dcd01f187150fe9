"""The observer hooks: which events producers and consumers send, that an
observer's own failures change nothing, the headers they attach, and the
envelope that carries them (old and new formats read each other)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager

import anyio
import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import EventKind, TaskEvent, TaskState
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.codec import pack, unpack
from aiogroupq._store.keys import QueueKeys
from aiogroupq.task import Envelope

QUEUE = "observers"
KEYS = QueueKeys(QUEUE)
PATIENCE = 30.0


class Recorder(aiogroupq.Observer):
    """Keeps every event, and the headers its handler contexts saw."""

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        self.events: list[TaskEvent] = []
        self.headers = headers
        self.seen_headers: list[Mapping[str, str]] = []

    def on_event(self, event: TaskEvent) -> None:
        self.events.append(event)

    def enqueue_context(
        self, queue: str, tasks: Sequence[aiogroupq.Task]
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        @contextmanager
        def attach() -> Iterator[Mapping[str, str] | None]:
            yield self.headers

        return attach()

    def handler_context(
        self, queue: str, task: aiogroupq.TaskInfo
    ) -> AbstractContextManager[None]:
        @contextmanager
        def see() -> Iterator[None]:
            self.seen_headers.append(task.headers)
            yield

        return see()

    def kinds(self, task_id: str) -> list[EventKind]:
        return [e.kind for e in self.events if e.task_id == task_id]

    def of(self, kind: EventKind) -> list[TaskEvent]:
        return [e for e in self.events if e.kind is kind]


async def wait_state(
    producer: aiogroupq.Producer, task_id: str, state: TaskState
) -> None:
    with anyio.fail_after(PATIENCE):
        while await producer.status(task_id) != state:
            await anyio.sleep(0.01)


async def idle(consumer: aiogroupq.Consumer) -> None:
    with anyio.fail_after(PATIENCE):
        while consumer.stats.running:
            await anyio.sleep(0.01)


async def test_events_of_a_task_life(redis_client: redis.asyncio.Redis) -> None:
    recorder = Recorder()

    async def ok(payload: int) -> None:
        await anyio.sleep(0.01)

    async def broken(payload: int) -> None:
        raise KeyError(payload)

    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[recorder]
    ) as producer:
        good = await producer.enqueue("ok", 1, group="g", dedup_key="once")
        again = await producer.enqueue("ok", 1, group="g", dedup_key="once")
        bad = await producer.enqueue("broken", 2, max_attempts=2)
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers={"ok": ok, "broken": broken},
            observers=[recorder],
            retry_backoff=0.01,
        ) as consumer:
            await wait_state(producer, good, TaskState.SUCCEEDED)
            await wait_state(producer, bad, TaskState.DEAD)
            await idle(consumer)
    assert again == good
    assert recorder.kinds(good) == [
        EventKind.ENQUEUED,  # once: the second enqueue was deduplicated
        EventKind.STARTED,
        EventKind.SUCCEEDED,
    ]
    assert recorder.kinds(bad) == [
        EventKind.ENQUEUED,
        EventKind.STARTED,
        EventKind.FAILED,
        EventKind.RETRIED,
        EventKind.STARTED,
        EventKind.FAILED,
        EventKind.DEAD,
    ]
    enqueued, started, succeeded = (e for e in recorder.events if e.task_id == good)
    assert (enqueued.queue, enqueued.task_type, enqueued.group) == (QUEUE, "ok", "g")
    assert started.attempt == 1
    assert isinstance(started.latency, float)  # from the server's clock
    assert isinstance(succeeded.duration, float)
    print(  # noqa: T201 - figures, not asserted
        f"\npickup latency {started.latency * 1000:.1f} ms, "
        f"handler duration {succeeded.duration * 1000:.1f} ms"
    )
    failed = [e for e in recorder.of(EventKind.FAILED) if e.task_id == bad]
    assert [e.attempt for e in failed] == [1, 2]
    assert all(isinstance(e.error, KeyError) for e in failed)
    (dead,) = recorder.of(EventKind.DEAD)
    assert (dead.task_type, dead.attempt) == ("broken", 2)


async def test_cancel_hand_back_and_lease_loss_events(
    redis_client: redis.asyncio.Redis,
) -> None:
    recorder = Recorder()
    started = {name: anyio.Event() for name in ("cancel", "back", "lose")}

    async def hold() -> None:
        started[aiogroupq.current_task().group or ""].set()
        await anyio.sleep_forever()

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = {
            group: await producer.enqueue("hold", group=group)
            for group in ("cancel", "back", "lose")
        }
        async with aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers={"hold": hold},
            observers=[recorder],
            # Short, so that the heartbeat finds "lose" lost soon; long
            # enough that a busy machine's pauses lose no other lease.
            lease_ttl=4.5,
            grace_period=0,
        ):
            with anyio.fail_after(PATIENCE):
                for event in started.values():
                    await event.wait()
            assert await producer.cancel(ids["cancel"])
            await wait_state(producer, ids["cancel"], TaskState.CANCELLED)
            # The server recovers "lose" and another consumer takes it.
            await redis_client.zadd(KEYS.leases, {ids["lose"]: 0}, xx=True)
            reply = await _scripts.claim(
                redis_client, KEYS, "other", k=1, lease_ms=600_000, scan_limit=9
            )
            assert [t.id for t in reply.tasks] == [ids["lose"]]
            with anyio.fail_after(PATIENCE):
                while not recorder.kinds(ids["lose"])[1:]:
                    await anyio.sleep(0.01)
        # Leaving with "back" still running hands it back.
    assert recorder.kinds(ids["cancel"]) == [EventKind.STARTED, EventKind.CANCELLED]
    assert recorder.kinds(ids["lose"]) == [EventKind.STARTED, EventKind.LEASE_LOST]
    assert recorder.kinds(ids["back"]) == [EventKind.STARTED, EventKind.HANDED_BACK]
    for kind in (EventKind.CANCELLED, EventKind.LEASE_LOST, EventKind.HANDED_BACK):
        (ended,) = recorder.of(kind)
        assert (ended.task_type, ended.attempt) == ("hold", 1)


async def test_an_expired_task_is_an_event(redis_client: redis.asyncio.Redis) -> None:
    recorder = Recorder()
    blocker_started, release = anyio.Event(), anyio.Event()

    async def hold() -> None:
        blocker_started.set()
        await release.wait()

    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("hold", group="g")
        late = await producer.enqueue("hold", group="g", expires=0.05)
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"hold": hold}, observers=[recorder]
        ):
            with anyio.fail_after(PATIENCE):
                await blocker_started.wait()
            await anyio.sleep(0.1)  # past the second task's expiry
            release.set()
            await wait_state(producer, late, TaskState.EXPIRED)
            # The claim that ended it reports it once its reply is read,
            # which may come after the state is visible.
            with anyio.fail_after(PATIENCE):
                while not recorder.kinds(late):
                    await anyio.sleep(0.01)
    assert recorder.kinds(late) == [EventKind.EXPIRED]


async def test_headers_reach_the_handler(redis_client: redis.asyncio.Redis) -> None:
    recorder = Recorder(headers={"traceparent": "00-abc-def-01"})
    seen: list[Mapping[str, str]] = []

    async def look() -> None:
        seen.append(aiogroupq.current_task().headers)

    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[recorder]
    ) as producer:
        task_id = await producer.enqueue("look")
        plain = Recorder()
        async with aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"look": look}, observers=[plain]
        ):
            await wait_state(producer, task_id, TaskState.SUCCEEDED)
    assert seen == [{"traceparent": "00-abc-def-01"}]
    assert plain.seen_headers == seen


async def test_headers_that_do_not_fit_are_dropped_with_a_warning(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    big = {"traceparent": "00-abc-def-01", "baggage": "x" * 1000, "n": 7}
    recorder = Recorder(headers=big)  # type: ignore[arg-type]  # a bad observer
    async with aiogroupq.Producer(
        redis_client, queue=QUEUE, observers=[recorder]
    ) as producer:
        with caplog.at_level(logging.WARNING, logger="aiogroupq"):
            task_id = await producer.enqueue("t")
    stored = await redis_client.hget(KEYS.task(task_id), "e")
    assert isinstance(stored, bytes)
    assert unpack(stored).headers == {"traceparent": "00-abc-def-01"}
    (warning,) = [r for r in caplog.records if "headers" in r.getMessage()]
    assert "'baggage'" in warning.getMessage()
    assert "'n'" in warning.getMessage()


class Broken(aiogroupq.Observer):
    """Fails in every hook."""

    def on_event(self, event: TaskEvent) -> None:
        raise RuntimeError("on_event")

    def enqueue_context(
        self, queue: str, tasks: Sequence[aiogroupq.Task]
    ) -> AbstractContextManager[Mapping[str, str] | None]:
        raise RuntimeError("enqueue_context")

    def handler_context(
        self, queue: str, task: aiogroupq.TaskInfo
    ) -> AbstractContextManager[None]:
        @contextmanager
        def fail_on_exit() -> Iterator[None]:
            yield
            raise RuntimeError("handler_context exit")

        return fail_on_exit()


async def test_a_failing_observer_changes_nothing(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()

    async def ok() -> None:
        pass

    async def bad() -> None:
        raise ValueError("the handler's own")

    with caplog.at_level(logging.ERROR, logger="aiogroupq.observer"):
        async with aiogroupq.Producer(
            redis_client, queue=QUEUE, observers=[Broken(), recorder]
        ) as producer:
            good = await producer.enqueue("ok")
            failing = await producer.enqueue("bad", max_attempts=1)
            async with aiogroupq.Consumer(
                redis_client,
                queue=QUEUE,
                handlers={"ok": ok, "bad": bad},
                observers=[Broken(), recorder],
            ):
                await wait_state(producer, good, TaskState.SUCCEEDED)
                await wait_state(producer, failing, TaskState.DEAD)
            async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
                (letter,) = await admin.dead_letters()
    # The handler's error, not the observer's exit error, is what counted.
    assert letter.reason == "ValueError: the handler's own"
    assert EventKind.SUCCEEDED in recorder.kinds(good)
    logged = {
        str(r.exc_info[1])
        for r in caplog.records
        if r.exc_info and r.name == "aiogroupq.observer"
    }
    assert logged == {"on_event", "enqueue_context", "handler_context exit"}


async def nothing() -> None:
    pass


@pytest.mark.parametrize("observers", [[object()], aiogroupq.Observer(), 3])
def test_observers_must_be_a_sequence_of_observers(observers: object) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match="observers"):
        aiogroupq.Producer("redis://localhost", queue=QUEUE, observers=observers)  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.ConfigurationError, match="observers"):
        aiogroupq.Consumer(
            "redis://localhost",
            queue=QUEUE,
            handlers={"t": nothing},
            observers=observers,  # type: ignore[arg-type]
        )


class OldEnvelope(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The envelope as released before headers were added."""

    id: str
    type: str
    payload: msgspec.Raw
    group: str | None = None
    max_attempts: int = 3
    timeout_ms: int | None = None
    enqueued_ms: int = 0


def test_old_and_new_envelopes_read_each_other() -> None:
    payload = msgspec.Raw(msgspec.msgpack.encode({"a": 1}))
    old = msgspec.msgpack.encode(OldEnvelope("id1", "t", payload, "g", 3, None, 5))
    assert unpack(old) == Envelope("id1", "t", payload, "g", 3, None, 5, None)
    new = pack(Envelope("id2", "t", payload, headers={"traceparent": "00-x"}))
    read_by_old = msgspec.msgpack.decode(new, type=OldEnvelope)
    assert (read_by_old.id, read_by_old.type) == ("id2", "t")
