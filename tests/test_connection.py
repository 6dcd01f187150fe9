"""Connecting to Redis: the time budget of a call, typed errors for every way
the connection can be wrong, credentials kept out of messages, and the
server checks made on entering (version, eviction policy)."""

from __future__ import annotations

import inspect
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store import connection as _connection, server_checks as _server_checks
from aiogroupq.testing._server import ServerProcess, free_port

from ._errorstats import error_count

if TYPE_CHECKING:
    from ._spawn import Spawn

QUEUE = "conn"
#: the documented budget of a round trip (aiogroupq._store.connection.CALL_BUDGET)
BUDGET = 5.0
#: liveness only: far below the 72 s a frozen server used to cost a call
PATIENCE = BUDGET * 3

# Every public coroutine method of Producer, called with harmless arguments.
# The test below fails when a method is added without an entry here.
ProducerCall = Callable[[aiogroupq.Producer], Awaitable[object]]
TASK_ID = "0" * 28
PRODUCER_CALLS: dict[str, ProducerCall] = {
    "enqueue": lambda p: p.enqueue("t", 1, group="g"),
    "enqueue_many": lambda p: p.enqueue_many([aiogroupq.Task("t", 1)]),
    "status": lambda p: p.status(TASK_ID),
    "cancel": lambda p: p.cancel(TASK_ID),
    "result": lambda p: p.result(TASK_ID, timeout=1.0),
    "status_many": lambda p: p.status_many([TASK_ID]),
}
AdminCall = Callable[[aiogroupq.Admin], Awaitable[object]]
ADMIN_CALLS: dict[str, AdminCall] = {
    "set_group": lambda a: a.set_group("g", concurrency=2),
    "update_group": lambda a: a.update_group("g", concurrency=2),
    "group_settings": lambda a: a.group_settings("g"),
    "pause_group": lambda a: a.pause_group("g"),
    "resume_group": lambda a: a.resume_group("g"),
    "configure": lambda a: a.configure(),
    "settings": lambda a: a.settings(),
    "pause": lambda a: a.pause(),
    "resume": lambda a: a.resume(),
    "stats": lambda a: a.stats(),
    "group_info": lambda a: a.group_info("g"),
    "groups": lambda a: a.groups(),
    "task": lambda a: a.task(TASK_ID),
    "position": lambda a: a.position(TASK_ID),
    "consumers": lambda a: a.consumers(),
    "dead_letters": lambda a: a.dead_letters(),
    "requeue_dead": lambda a: a.requeue_dead(TASK_ID),
    "purge_dead": lambda a: a.purge_dead(all=True),
    "release_group": lambda a: a.release_group("g"),
    "release_consumer": lambda a: a.release_consumer("c"),
    "payload_previews": lambda a: a.payload_previews("t"),
    "partitions": lambda a: a.partitions(),
    "start_repartition": lambda a: a.start_repartition(2),
    "finish_repartition": lambda a: a.finish_repartition(),
    "estimate": lambda a: a.estimate(TASK_ID),
    "cancel_group": lambda a: a.cancel_group("g"),
    "purge_group": lambda a: a.purge_group("g"),
}


async def _noop() -> None:
    pass


def test_the_documented_budget_is_the_one_in_force() -> None:
    assert _connection.CALL_BUDGET == BUDGET


def test_every_producer_and_admin_method_is_walked() -> None:
    for cls, calls in (
        (aiogroupq.Producer, PRODUCER_CALLS),
        (aiogroupq.Admin, ADMIN_CALLS),
    ):
        public = {
            name
            for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and inspect.iscoroutinefunction(member)
        }
        assert public == set(calls), cls


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test's own, to freeze, kill or lock."""
    own = ServerProcess(workdir=tmp_path)
    own.start()
    try:
        yield own
    finally:
        if own.process is not None and own.process.poll() is None:
            own.process.send_signal(signal.SIGCONT)
        own.stop()


async def _walk(
    target: Any, calls: dict[str, Callable[[Any], Awaitable[object]]]
) -> dict[str, tuple[BaseException | None, float]]:
    """Call every method of ``calls`` on ``target`` at once; what each
    raised, and when (at once: a stopped server costs each call its budget)."""
    seen: dict[str, tuple[BaseException | None, float]] = {}

    async def one(name: str, call: Callable[[Any], Awaitable[object]]) -> None:
        start = time.monotonic()
        error: BaseException | None = None
        try:
            await call(target)
        except Exception as exc:  # noqa: BLE001 - what the walk collects
            error = exc
        seen[name] = (error, time.monotonic() - start)

    with anyio.fail_after(PATIENCE):
        async with anyio.create_task_group() as tg:
            for name, call in calls.items():
                tg.start_soon(one, name, call)
    return seen


def _report(label: str, seen: dict[str, tuple[BaseException | None, float]]) -> None:
    slowest = max(seconds for _, seconds in seen.values())
    kinds = sorted({type(error).__name__ for error, _ in seen.values()})
    print(f"[{label}] {len(seen)} calls, slowest {slowest:.2f} s, raised {kinds}")  # noqa: T201


@pytest.mark.slow
async def test_a_frozen_server_fails_every_producer_call_within_the_budget(
    server: ServerProcess,
) -> None:
    # SIGSTOP: the kernel still accepts connections, nothing ever answers.
    # Each call used to hang for 7 socket timeouts (72 s measured).
    async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
        task_id = await producer.enqueue("t", 1)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            seen = await _walk(producer, PRODUCER_CALLS)
            start = time.monotonic()
            with pytest.raises(aiogroupq.RedisUnavailableError):
                await aiogroupq.check_queue(server.url, QUEUE)
            check_seconds = time.monotonic() - start
        finally:
            server.process.send_signal(signal.SIGCONT)
        _report("frozen", seen)
        print(f"[frozen] check_queue raised after {check_seconds:.2f} s")  # noqa: T201
        for name, (error, _) in seen.items():
            assert isinstance(error, aiogroupq.RedisUnavailableError), (name, error)
        # Once the server runs again, the same producer works (the connections
        # cut mid-command were dropped, not reused out of step).
        with anyio.fail_after(PATIENCE):
            assert await producer.status(task_id) is aiogroupq.TaskState.QUEUED
            assert await producer.status(TASK_ID) is None


@pytest.mark.slow
async def test_entering_while_the_server_is_frozen_fails_within_the_budget(
    server: ServerProcess,
) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        for label, entered in (
            ("Producer", aiogroupq.Producer(server.url, queue=QUEUE)),
            (
                "Consumer",
                aiogroupq.Consumer(server.url, queue=QUEUE, handlers={"h": _noop}),
            ),
        ):
            start = time.monotonic()
            with (
                anyio.fail_after(PATIENCE),
                pytest.raises(aiogroupq.RedisUnavailableError),
            ):
                async with entered:
                    pass
            took = time.monotonic() - start
            print(f"[frozen] entering a {label} raised after {took:.2f} s")  # noqa: T201
    finally:
        server.process.send_signal(signal.SIGCONT)


@pytest.mark.slow
async def test_a_consumer_keeps_working_through_a_freeze_longer_than_the_budget(
    server: ServerProcess,
) -> None:
    done: list[int] = []

    async def h(n: int) -> None:
        done.append(n)

    async with (
        aiogroupq.Producer(server.url, queue=QUEUE) as producer,
        aiogroupq.Consumer(server.url, queue=QUEUE, handlers={"h": h}, lease_ttl=30),
    ):
        await producer.enqueue("h", 1)
        with anyio.fail_after(PATIENCE):
            while not done:
                await anyio.sleep(0.01)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        await anyio.sleep(BUDGET + 1)
        server.process.send_signal(signal.SIGCONT)
        await producer.enqueue("h", 2)
        with anyio.fail_after(PATIENCE * 2):
            while len(done) < 2:
                await anyio.sleep(0.01)
    assert done == [1, 2]


async def test_a_stopped_server_fails_every_producer_call(
    server: ServerProcess,
) -> None:
    async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
        await producer.enqueue("t", 1)
        server.stop()
        seen = await _walk(producer, PRODUCER_CALLS)
    _report("down", seen)
    for name, (error, _) in seen.items():
        assert isinstance(error, aiogroupq.RedisUnavailableError), (name, error)


async def test_a_stopped_server_fails_every_admin_call(
    server: ServerProcess,
) -> None:
    async with aiogroupq.Admin(server.url, queue=QUEUE) as admin:
        await admin.stats()
        server.stop()
        seen = await _walk(admin, ADMIN_CALLS)
    _report("down", seen)
    for name, (error, _) in seen.items():
        assert isinstance(error, aiogroupq.RedisUnavailableError), (name, error)


@pytest.mark.parametrize("kind", ["Producer", "Consumer", "check_queue"])
async def test_entering_with_nothing_listening_is_redis_unavailable(
    kind: str,
) -> None:
    # The Consumer used to leak redis-py's own ConnectionError; and the
    # error named neither the address nor the refusal ("no answer from Redis
    # within 5 s (no reply)"), which only the worker's log did.
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    with (
        anyio.fail_after(PATIENCE),
        pytest.raises(aiogroupq.RedisUnavailableError) as caught,
    ):
        await _enter(kind, url)
    _assert_names_the_refusal(caught.value, port)


def _assert_names_the_refusal(error: BaseException, port: int) -> None:
    """*error* says where (host:port, no password), why, and that the
    budget of re-sends ran out."""
    message = str(error)
    assert f"127.0.0.1:{port}" in message, message
    assert "connection refused" in message, message
    assert f"gave up after {BUDGET:.1f} s of retries" in message, message
    assert "hunter2" not in message, message


async def test_a_call_to_a_stopped_server_names_it_and_the_refusal(
    server: ServerProcess,
) -> None:
    # A producer's call re-sends within its own budget (no start-up check
    # around it): its error says the same.
    url = server.url.replace("redis://", "redis://:hunter2@")
    admin = redis.asyncio.Redis(port=server.port)
    await admin.config_set("requirepass", "hunter2")
    await admin.aclose()
    async with aiogroupq.Producer(url, queue=QUEUE) as producer:
        await producer.enqueue("t", 1)
        server.stop()
        with (
            anyio.fail_after(PATIENCE),
            pytest.raises(aiogroupq.RedisUnavailableError) as caught,
        ):
            await producer.status(TASK_ID)
    _assert_names_the_refusal(caught.value, server.port)


async def test_the_cli_names_the_address_and_the_refusal(spawn: Spawn) -> None:
    port = free_port()
    proc = spawn(
        "stats", "--queue", QUEUE,
        "--redis-url", f"redis://:hunter2@127.0.0.1:{port}/0",
    )  # fmt: skip
    assert await proc.wait() == 2, proc.output
    lines = proc.output.strip().splitlines()
    assert len(lines) == 1, proc.output
    assert lines[0].startswith("aiogroupq stats: error: "), proc.output
    assert "Redis is unreachable" in lines[0]
    _assert_names_the_refusal(Exception(lines[0]), port)


@pytest.mark.parametrize("kind", ["Producer", "Consumer", "check_queue"])
async def test_entering_while_the_server_starts_waits_for_it(
    kind: str, tmp_path: Path
) -> None:
    # A consumer (re)started during a Redis restart used to fail at once on
    # the refused connection, and a producer after about 1.3 s (a count of
    # re-sends, each refusal instant); the budget of a call covers that.
    port = free_port()
    late = ServerProcess(workdir=tmp_path, port=port)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_enter, kind, f"redis://127.0.0.1:{port}/0")
            # Past the old 1.3 s of re-sends, and early enough that a slow
            # start still ends within the budget.
            await anyio.sleep(1.5)
            await anyio.to_thread.run_sync(late.start)
    finally:
        late.stop()


async def _enter(kind: str, url: str) -> None:
    if kind == "check_queue":
        await aiogroupq.check_queue(url, QUEUE)
        return
    entered: aiogroupq.Producer | aiogroupq.Consumer = (
        aiogroupq.Producer(url, queue=QUEUE)
        if kind == "Producer"
        else aiogroupq.Consumer(url, queue=QUEUE, handlers={"h": _noop})
    )
    async with entered:
        pass


# -- refused credentials and bad databases ---------------------------------------


@pytest.mark.parametrize("kind", ["Producer", "Consumer", "check_queue"])
@pytest.mark.parametrize(
    ("userinfo", "password_set"),
    [
        ("nobody:hunter2@", False),  # no such user
        (":hunter2@", True),  # wrong password
        ("", True),  # none given where one is needed
    ],
)
async def test_refused_credentials_raise_authentication_error_at_once(
    server: ServerProcess, kind: str, userinfo: str, password_set: bool
) -> None:
    # redis-py counts a refused password as a connection error and retried
    # it for seconds, then reported "Redis is unreachable".
    if password_set:
        admin = redis.asyncio.Redis(port=server.port)
        await admin.config_set("requirepass", "right")
        await admin.aclose()
    url = f"redis://{userinfo}127.0.0.1:{server.port}/0"
    start = time.monotonic()
    with (
        anyio.fail_after(PATIENCE),
        pytest.raises(aiogroupq.AuthenticationError) as caught,
    ):
        await _enter(kind, url)
    took = time.monotonic() - start
    print(f"[auth] {kind} {userinfo or 'no password'}: {took:.3f} s")  # noqa: T201
    assert isinstance(caught.value, aiogroupq.ConfigurationError)
    assert "hunter2" not in str(caught.value)
    assert "Redis refused the credentials" in str(caught.value)


@pytest.mark.parametrize("kind", ["Producer", "Consumer", "check_queue"])
async def test_a_database_number_out_of_range_is_a_configuration_error(
    redis_url: str, kind: str
) -> None:
    # A raw redis ResponseError leaked before.
    url = redis_url.rsplit("/", 1)[0] + "/999"
    with (
        anyio.fail_after(PATIENCE),
        pytest.raises(aiogroupq.ConfigurationError, match="database number"),
    ):
        await _enter(kind, url)


async def test_a_password_changed_under_a_producer_fails_each_call_typed(
    server: ServerProcess,
) -> None:
    async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
        await producer.enqueue("t", 1)
        admin = redis.asyncio.Redis(port=server.port)
        await admin.config_set("requirepass", "changed")
        await admin.client_kill_filter(_type="normal")  # cut every connection
        await admin.aclose()
        seen = await _walk(producer, PRODUCER_CALLS)
    _report("password changed", seen)
    for name, (error, _) in seen.items():
        assert isinstance(error, aiogroupq.AuthenticationError), (name, error)


# -- credentials never printed ---------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:hunter2@host/1", "redis://user:***@host/1"),
        ("rediss://user:hun:ter2@host", "rediss://user:***@host"),
        ("redis://:hun@ter2@host:6379", "redis://:***@host:6379"),
        ("redis://:hunter2/x@host:port/0", "redis://:***@host:port/0"),
        ("redis://hunter2@host", "redis://***@host"),
        ("redis://host:6379/0?password=hunter2&db=1", None),
        ("unix:///run/redis.sock?password=hunter2", None),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis//:hunter2@host", None),
    ],
)
def test_safe_url_masks_the_password(url: str, shown: str | None) -> None:
    masked = _connection.safe_url(url)
    assert "hunter2" not in masked
    assert "ter2" not in masked
    if shown is not None:
        assert masked == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2/x@127.0.0.1:notaport/0",  # the parser quotes "hunter2"
        "redis://user:hunter2@127.0.0.1:notaport/0",
        "redis://user:hunter2@[::1:6379/0",  # unbalanced IPv6 bracket
        "http://user:hunter2@127.0.0.1:6379/0",
        "redis://127.0.0.1:6379/0?password=hunter2&socket_timeout=soon",
    ],
)
@pytest.mark.parametrize("kind", ["Producer", "Consumer", "check_queue"])
async def test_a_malformed_url_is_refused_without_printing_the_password(
    url: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(aiogroupq.ConfigurationError) as caught:
        await _enter(kind, url)
    assert "Redis URL" in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert caught.value.__cause__ is None  # the parser's error quotes the URL
    assert "hunter2" not in caplog.text


# -- server checks on entering -------------------------------------------------------


@pytest.fixture
async def evicting(redis_client: redis.asyncio.Redis) -> AsyncIterator[None]:
    """The test server with an eviction policy, restored afterwards."""
    await redis_client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        yield
    finally:
        await redis_client.config_set("maxmemory-policy", "noeviction")


@pytest.mark.parametrize("kind", ["Producer", "Consumer"])
@pytest.mark.usefixtures("evicting")
async def test_an_evicting_server_is_refused_unless_allowed(
    redis_url: str, kind: str
) -> None:
    # allkeys-lru was measured to evict 1,228 of 4,000 acknowledged tasks;
    # entering used to log a warning and accept work anyway.
    with pytest.raises(aiogroupq.ConfigurationError, match="allkeys-lru") as caught:
        await _enter(kind, redis_url)
    assert "noeviction" in str(caught.value)
    assert "allow_eviction=True" in str(caught.value)
    # Opting out explicitly works, and the queue is usable.
    done = anyio.Event()

    async def h() -> None:
        done.set()

    async with (
        aiogroupq.Producer(redis_url, queue=QUEUE, allow_eviction=True) as producer,
        aiogroupq.Consumer(
            redis_url, queue=QUEUE, handlers={"h": h}, allow_eviction=True
        ),
    ):
        await producer.enqueue("h")
        with anyio.fail_after(PATIENCE):
            await done.wait()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_allow_eviction_must_be_a_bool(value: object) -> None:
    with pytest.raises(aiogroupq.ConfigurationError, match="allow_eviction"):
        aiogroupq.Producer("redis://x", queue=QUEUE, allow_eviction=value)  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.ConfigurationError, match="allow_eviction"):
        aiogroupq.Consumer(
            "redis://x",
            queue=QUEUE,
            handlers={"h": _noop},
            allow_eviction=value,  # type: ignore[arg-type]
        )


@asynccontextmanager
async def _user(
    admin: redis.asyncio.Redis, redis_url: str, name: str, **acl: Any
) -> AsyncIterator[str]:
    """A Redis user with password "pw" and the given ACL, for the block: the
    URL that logs in as it."""
    user = f"{name}-{os.getpid()}"
    await admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], **acl)
    try:
        yield redis_url.replace("redis://", f"redis://{user}:pw@")
    finally:
        await admin.acl_deluser(user)


@pytest.mark.parametrize("kind", ["Producer", "Consumer"])
async def test_a_denied_config_command_logs_one_warning_and_goes_on(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Managed services deny CONFIG (and least-privilege users lack it): the
    # policy cannot be checked, which must not stop anyone from starting.
    async with _user(
        redis_client,
        redis_url,
        "noconfig",
        categories=["+@all"],
        commands=["-config", "-info"],
    ) as url:
        with caplog.at_level(logging.WARNING, logger="aiogroupq"):
            await _enter(kind, url)
    warnings = [r for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "noeviction" in warnings[0].getMessage()
    assert "pw@" not in caplog.text


async def test_the_version_check_needs_no_info_command(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # HELLO tells the version; INFO, denied by -@dangerous, is not needed.
    async with _user(
        redis_client, redis_url, "noinfo", categories=["+@all", "-@dangerous"]
    ) as url:
        with caplog.at_level(logging.WARNING, logger="aiogroupq"):
            await _enter("Consumer", url)
    assert "version" not in caplog.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [(b"7.2.4", (7, 2)), ("6.2.14", (6, 2)), (b"8", (8, 0)), ("unknown", None)],
)
def test_server_versions_are_read_as_major_minor(
    text: object, expected: tuple[int, int] | None
) -> None:
    assert _server_checks._version(text) == expected


# -- a demoted primary behind a plain URL ------------------------------------------


async def _errors(client: redis.asyncio.Redis, code: str) -> int:
    """How many error replies with this code the server has sent."""
    return error_count(await client.info("errorstats"), code)


async def test_a_readonly_reply_is_sent_again_until_the_server_is_promoted(
    aiogroupq_server_factory: Callable[..., ServerProcess],
) -> None:
    # A plain redis:// URL of a managed endpoint that still leads to a
    # primary demoted in a failover: it answers READONLY, having applied
    # nothing, and the write goes on within its budget once the endpoint
    # leads to a primary again (here the same server, promoted). It raised
    # redis-py's ReadOnlyError at once.
    primary = aiogroupq_server_factory()
    node = aiogroupq_server_factory()
    # The queue's keys on both: the node copies the primary's on demotion.
    for server in (primary, node):
        async with aiogroupq.Producer(server.url, queue=QUEUE) as producer:
            await producer.enqueue("t", 1)
    admin = redis.asyncio.Redis.from_url(node.url)
    try:
        async with aiogroupq.Producer(node.url, queue=QUEUE) as producer:
            await admin.replicaof("127.0.0.1", primary.port)
            with anyio.fail_after(PATIENCE):  # liveness only
                while (await admin.info("replication")).get(
                    "master_link_status"
                ) != "up":
                    await anyio.sleep(0.02)

            async def promote_once_refused() -> None:
                with anyio.fail_after(PATIENCE):
                    while await _errors(admin, "READONLY") < 1:
                        await anyio.sleep(0.02)
                await admin.replicaof("NO", "ONE")

            async with anyio.create_task_group() as tg:
                tg.start_soon(promote_once_refused)
                task_id = await producer.enqueue("t", 2)
            assert await producer.status(task_id) == "queued"
        assert await _errors(admin, "READONLY") >= 1
    finally:
        await admin.aclose()
