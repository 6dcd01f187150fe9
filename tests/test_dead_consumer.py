"""A dead consumer as the operator sees it, and handing its tasks back.

A consumer registered on this host whose process is gone is "gone (pid not
running)" at once, not alive until its lease ends; one whose heartbeat is
late is "silent"; the tasks a consumer holds come from the server's recovery
keys, not from its latest heartbeat; a restarted ``--name`` counts its
uptime from its own start. ``Admin.release_consumer`` (and ``aiogroupq
release --consumer``) hands a dead consumer's tasks back at once, fenced as
any recovery, and refuses a consumer that may be alive.

Most states are set up with the real scripts: a consumer "on this host with
its process gone" is registered with this host's name and the pid of a
child process that has exited and been reaped. One test kills a real
consumer process with SIGKILL in the middle of a task.
"""

from __future__ import annotations

import html
import json
import multiprocessing.process
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
import redis.asyncio
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq import ConsumerRunningError, GroupState, TaskState
from aiogroupq._inspect.views import span_text
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.registry import pid_running
from aiogroupq._store.replies import FinishCode, HeartbeatCode
from aiogroupq.dashboard import create_app

from ._journal import Flag, Job, Journal, client_for, spawned
from ._web import serving

if TYPE_CHECKING:
    from aiogroupq.testing._cluster_server import ClusterProcess

QUEUE = "dead-consumer"
KEYS = QueueKeys(QUEUE)
LEASE_MS = 60_000
ROOT = Path(__file__).resolve().parents[1]
HOST = socket.gethostname()
#: liveness only
PATIENCE = 60.0


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert pid_running(HOST, child.pid) is False
    return child.pid


Client = redis.asyncio.Redis | RedisCluster


async def register(
    client: Client,
    name: str,
    *,
    host: str = "elsewhere",
    pid: int = 4242,
    lease_ms: int = LEASE_MS,
    keys: QueueKeys = KEYS,
    in_flight: int = 0,
) -> None:
    """A consumer's heartbeat as consumer.py sends it (no tasks renewed)."""
    await _scripts.heartbeat(
        client,
        keys,
        [],
        lease_ms=lease_ms,
        consumer=name,
        registration=[("host", host), ("pid", pid), ("c", 1), ("n", in_flight)],
    )


async def claim_as(
    client: Client, consumer: str, keys: QueueKeys = KEYS, k: int = 1
) -> list[_scripts.Claimed]:
    reply = await _scripts.claim(
        client, keys, consumer, k=k, lease_ms=LEASE_MS, scan_limit=100
    )
    return reply.tasks


@pytest.fixture
async def both(redis_client: redis.asyncio.Redis) -> Any:
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
    ):
        yield producer, admin


async def consumer_named(admin: aiogroupq.Admin, name: str) -> aiogroupq.ConsumerInfo:
    (found,) = [c for c in await admin.consumers() if c.name == name]
    return found


# -- what the views say ----------------------------------------------------------


async def test_a_consumer_here_whose_process_is_gone_is_gone_at_once(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await producer.enqueue("t", group="g")
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    await register(redis_client, "other")  # a live consumer, elsewhere
    await claim_as(redis_client, "dead")

    dead = await consumer_named(admin, "dead")
    assert (dead.state, dead.status, dead.alive, dead.pid_running) == (
        "gone",
        "gone (pid not running)",
        False,
        False,
    )
    other = await consumer_named(admin, "other")
    assert (other.state, other.status, other.alive, other.pid_running) == (
        "alive",
        "alive",
        True,
        None,  # another host: not known from here
    )

    info = await admin.group_info("g")
    print(info.reason)  # noqa: T201
    (holder,) = [h for h in info.holders if h.slot == "running"]
    assert (holder.consumer_state, holder.consumer_status, holder.consumer_alive) == (
        "gone",
        "gone (pid not running)",
        False,
    )
    assert info.consumers_alive == 1  # "other"; not the dead one
    assert (
        f"task {task_id}'s consumer dead is gone (its process is not running on "
        "this host)"
    ) in info.reason
    assert "the first claim after that recovers the task (in " in info.reason
    assert "to hand it back now: aiogroupq release --consumer dead" in info.reason
    details = await admin.task(task_id)
    assert details.reason.startswith(
        "running, but its consumer dead is gone (its process is not running"
    )
    assert (details.consumer_state, details.consumer_alive) == ("gone", False)


async def test_the_only_consumer_gone_says_no_consumer_is_alive(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    await producer.enqueue("t", group="g")
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    await claim_as(redis_client, "dead")
    info = await admin.group_info("g")
    assert info.consumers_alive == 0  # the registry counts it; its pid is gone
    assert "no consumer is alive to recover the task: start one" in info.reason


async def test_a_late_heartbeat_is_silent_and_says_when_the_task_is_recovered(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await register(redis_client, "quiet", lease_ms=LEASE_MS)
    await register(redis_client, "other")
    (task,) = await claim_as(redis_client, "quiet")
    # Its latest heartbeat 40 s ago, its lease (60 s) not over: a heartbeat
    # is due every 20 s, and it missed one.
    hb = int(await redis_client.hget(KEYS.consumer_info("quiet"), "hb") or 0)
    await redis_client.hset(KEYS.consumer_info("quiet"), "hb", hb - 40_000)

    quiet = await consumer_named(admin, "quiet")
    assert quiet.state == "silent"
    assert quiet.alive
    assert quiet.heartbeat_every == 20.0
    # 40 s and whatever the machine took since (up to the lease's 60 s).
    assert re.match(r"silent for [45]\d\.\ds", quiet.status), quiet.status
    assert quiet.status.endswith("s (heartbeat due every 20.0s)")

    info = await admin.group_info("g")
    print(info.reason)  # noqa: T201
    assert re.match(
        rf"1 running, but task {task_id}'s consumer quiet is silent for [45]\d\.",
        info.reason,
    ), info.reason
    lease = info.holders[0].lease_deadline
    assert lease is not None
    assert (
        "; the first claim after that recovers the task (in "
        f"{span_text(lease - info.now)}) unless its consumer comes back"
    ) in info.reason
    assert "release" not in info.reason  # refused for a silent consumer
    assert info.holders[0].consumer_state == "silent"
    with pytest.raises(ConsumerRunningError) as refused:
        await admin.release_consumer("quiet")
    assert "consumer 'quiet' is silent for" in str(refused.value)
    assert (await admin.task(task.id)).state == TaskState.RUNNING

    # The only other consumer gone too: nobody recovers it then.
    await redis_client.zrem(KEYS.consumers, "other")
    info = await admin.group_info("g")
    assert "no other consumer is alive to recover the task then" in info.reason


async def test_in_flight_is_what_the_consumer_holds_on_the_server(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "dead-consumer-parts"
    async with (
        aiogroupq.Producer(redis_client, queue=queue, partitions=3) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        ids = await producer.enqueue_many(
            [aiogroupq.Task("t", group=f"g{i}") for i in range(12)]
        )
        # Its heartbeat said 0 in flight, and it holds tasks in the partitions.
        await register(redis_client, "w", keys=QueueKeys(queue), in_flight=0)
        claimed = [
            [t.id for t in await claim_as(redis_client, "w", QueueKeys(queue, p), 2)]
            for p in range(3)
        ]
        assert sum(1 for c in claimed if c) >= 2  # in more than one partition
        held = [i for c in claimed for i in c]
        (w,) = await admin.consumers()
        assert (w.in_flight, w.stats.running) == (len(held), 0)
        assert (await admin.stats()).running == len(held)
        assert set(held) <= set(ids)


async def test_a_restarted_name_counts_its_uptime_from_its_own_start(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    _, admin = both
    await register(redis_client, "w", pid=111)
    await redis_client.hset(KEYS.consumer_info("w"), "st", 1000)  # long ago
    await register(redis_client, "w", pid=111)  # the same process beats on
    assert (await consumer_named(admin, "w")).started == 1.0
    await register(redis_client, "w", pid=222)  # restarted: another process
    w = await consumer_named(admin, "w")
    assert w.started > 1000.0
    assert abs(w.started - w.last_heartbeat) < 5.0
    await redis_client.hset(KEYS.consumer_info("w"), "st", 1000)
    await register(redis_client, "w", host="another-host", pid=222)
    assert (await consumer_named(admin, "w")).started > 1000.0


async def test_a_name_run_again_by_the_same_process_counts_its_uptime_anew(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    # An earlier run of "w" by this very host and pid (a container restarted
    # as pid 1, a Consumer entered again) left its registration behind.
    _, admin = both
    await _scripts.heartbeat(
        redis_client,
        KEYS,
        [],
        lease_ms=LEASE_MS,
        consumer="w",
        registration=[("host", HOST), ("pid", os.getpid()), ("i", "earlier-run")],
    )
    await redis_client.hset(KEYS.consumer_info("w"), "st", 1000)  # long ago

    async def noop() -> None:
        pass

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"t": noop}, name="w", concurrency=3
    ):
        with anyio.fail_after(PATIENCE):
            while (w := await consumer_named(admin, "w")).concurrency != 3:
                await anyio.sleep(0.02)
    assert w.started > 1000.0, "this run kept the earlier run's start"


def page_text(page: str) -> str:
    """A page's visible text, whitespace collapsed."""
    body = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.DOTALL)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


async def test_the_dashboard_shows_the_same(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, _ = both
    task_id = await producer.enqueue("t", group="g")
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    await register(redis_client, "quiet")
    hb = int(await redis_client.hget(KEYS.consumer_info("quiet"), "hb") or 0)
    await redis_client.hset(KEYS.consumer_info("quiet"), "hb", hb - 40_000)
    await claim_as(redis_client, "dead")
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            page = page_text((await client.get(f"/q/{QUEUE}/consumers")).text)
            print(page)  # noqa: T201
            assert "dead elsewhere" not in page
            assert re.search(r"dead \S+ \d+ gone gone \(pid not running\) 1 1 ", page)
            assert re.search(
                r"quiet elsewhere 4242 silent silent for [45]\d\.\ds \(heartbeat due "
                r"every 20\.0s\) 0 1 ",
                page,
            )
            page = page_text(
                (await client.get(f"/q/{QUEUE}/group", params={"name": "g"})).text
            )
            assert (
                f"task {task_id}'s consumer dead is gone (its process is not "
                "running on this host)"
            ) in page
            assert "dead (gone (pid not running))" in page  # its slot holder


# -- handing the tasks back ----------------------------------------------------------


async def test_release_hands_back_fenced_and_refuses_a_live_consumer(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    first, second = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    await register(redis_client, "live")
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    other = await producer.enqueue("t", group="h")
    (held,) = await claim_as(redis_client, "dead")
    (kept,) = await claim_as(redis_client, "live")
    assert (held.id, kept.id) == (first, other)

    with pytest.raises(ConsumerRunningError) as refused:
        await admin.release_consumer("live")
    assert "consumer 'live' is alive" in str(refused.value)
    assert "its lease ends in " in str(refused.value)
    assert (await admin.task(other)).state == TaskState.RUNNING

    assert await admin.release_consumer("dead") == 1
    details = await admin.task(first)
    assert (details.state, details.consumer, details.attempt) == (
        TaskState.QUEUED,
        None,
        1,
    )
    assert (await admin.task(second)).slot == "line"  # still behind it
    # Fenced: the dead holder's late heartbeat and result are refused.
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(held.id, held.token)], lease_ms=LEASE_MS
    ) == [HeartbeatCode.LOST]
    outcome = _scripts.Outcome(held.id, held.token, "ok")
    assert await _scripts.finish(
        redis_client, KEYS, [outcome], retention_ms=60_000
    ) == [FinishCode.LEASE_LOST]
    # It runs again, first in its group, its attempt counted.
    (again,) = await claim_as(redis_client, "live")
    assert (again.id, again.attempt) == (first, 2)
    assert again.token != held.token
    assert await admin.release_consumer("dead") == 0  # nothing left
    assert await admin.release_consumer("never-heard-of") == 0
    assert (await consumer_named(admin, "dead")).in_flight == 0


async def test_release_refuses_a_name_a_live_process_holds_though_unregistered(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    """A damaged registry key skips a consumer's registration; its name hold
    (``host:pid:token``, renewed with its heartbeats) still says it lives."""
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await claim_as(redis_client, "held")
    await redis_client.set(KEYS.consumer("held"), "elsewhere:4242:cafe", px=LEASE_MS)
    with pytest.raises(ConsumerRunningError) as refused:
        await admin.release_consumer("held")
    assert "its tasks are recovered when their leases end" in str(refused.value)
    await redis_client.set(KEYS.consumer("held"), f"{HOST}:{dead_pid()}:cafe")
    assert await admin.release_consumer("held") == 1
    assert (await admin.task(task_id)).state == TaskState.QUEUED


async def test_release_of_a_consumer_past_its_lease_on_another_host(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await register(redis_client, "far")
    await claim_as(redis_client, "far")
    with pytest.raises(ConsumerRunningError):
        await admin.release_consumer("far")
    await redis_client.zadd(KEYS.consumers, {"far": 0}, xx=True)  # silent past it
    far = await consumer_named(admin, "far")
    assert far.state == "gone"
    assert far.status.startswith("gone (silent for ")
    assert far.status.endswith(", past its 1m00s lease)")
    info = await admin.group_info("g")
    assert "to hand it back now: aiogroupq release --consumer far" in info.reason
    assert await admin.release_consumer("far") == 1
    assert (await admin.task(task_id)).state == TaskState.QUEUED


async def test_release_over_partitions(redis_client: redis.asyncio.Redis) -> None:
    queue = "dead-consumer-release-parts"
    async with (
        aiogroupq.Producer(redis_client, queue=queue, partitions=3) as producer,
        aiogroupq.Admin(redis_client, queue=queue) as admin,
    ):
        await producer.enqueue_many(
            [aiogroupq.Task("t", group=f"g{i}") for i in range(12)]
        )
        await register(
            redis_client, "dead", host=HOST, pid=dead_pid(), keys=QueueKeys(queue)
        )
        held = [
            t.id
            for p in range(3)
            for t in await claim_as(redis_client, "dead", QueueKeys(queue, p), 2)
        ]
        assert await admin.release_consumer("dead") == len(held)
        for task_id in held:
            assert (await admin.task(task_id)).state == TaskState.QUEUED
        assert (await admin.stats()).running == 0


async def test_release_checks_its_argument(both: Any) -> None:
    _, admin = both
    for bad in ("", None, 3):
        with pytest.raises(aiogroupq.ConfigurationError):
            await admin.release_consumer(bad)


# -- the command line ------------------------------------------------------------


async def cli(*args: str, url: str) -> tuple[int, str, str]:
    argv = [sys.executable, "-m", "aiogroupq", *args, "--queue", QUEUE]
    argv += ["--redis-url", url]
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(argv, check=False, cwd=ROOT)
    out, err = done.stdout.decode(), done.stderr.decode()
    print(f"$ aiogroupq {' '.join(args)}\n{out}{err}")  # noqa: T201
    return done.returncode, out, err


async def test_the_release_command(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    first = await producer.enqueue("t", group="g")
    other = await producer.enqueue("t", group="h")
    await register(redis_client, "live")
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    await claim_as(redis_client, "dead")
    await claim_as(redis_client, "live")

    code, out, err = await cli("consumers", url=redis_url)
    assert code == 0
    (row,) = [line for line in out.splitlines() if line.startswith("dead ")]
    assert "gone (pid not running)" in row
    code, out, _ = await cli("consumers", "--json", url=redis_url)
    by_name = {c["name"]: c for c in json.loads(out)}
    assert (by_name["dead"]["state"], by_name["dead"]["in_flight"]) == ("gone", 1)
    assert by_name["live"]["state"] == "alive"

    code, out, err = await cli("release", "--consumer", "live", url=redis_url)
    assert (code, out) == (1, "")
    assert err.startswith("aiogroupq release: consumer 'live' is alive: ")
    assert (await admin.task(other)).state == TaskState.RUNNING

    code, out, err = await cli("release", "--consumer", "dead", url=redis_url)
    assert (code, err) == (0, "")
    assert (
        out == "handed back 1 task of consumer 'dead', each to the front of its group\n"
    )
    assert (await admin.task(first)).state == TaskState.QUEUED

    code, out, err = await cli("release", "--consumer", "dead", url=redis_url)
    assert (code, out) == (1, "")
    assert "consumer 'dead' is gone (pid not running) and holds no task" in err
    code, out, err = await cli("release", "--consumer", "nobody", url=redis_url)
    assert (code, out) == (1, "")
    assert "no consumer named 'nobody' is registered" in err
    code, _, err = await cli("release", "g", "--consumer", "dead", url=redis_url)
    assert code == 2
    assert "give a halted GROUP or --consumer NAME (not both)" in err


# -- a real consumer process, killed ------------------------------------------------


def _consume(url: str, ready: Flag, stop: Flag) -> None:
    """Target of a ``spawn`` child: one consumer of QUEUE, journaling its runs;
    the first attempt of task 0 runs until the process is killed."""
    anyio.run(_consuming, url, ready, stop, backend="asyncio")


async def _consuming(url: str, ready: Flag, stop: Flag) -> None:
    client = client_for(url)
    journal = Journal(client)

    async def work(job: Job) -> None:
        async with journal.run(job) as info:
            if job.n == 0 and info.attempt == 1:
                await anyio.sleep_forever()

    try:
        async with aiogroupq.Consumer(
            url,
            queue=QUEUE,
            handlers={"work": work},
            concurrency=1,
            lease_ttl=LEASE_MS / 1000,  # never runs out during the test
            grace_period=5.0,
        ):
            ready.set()
            while not stop.is_set():
                await anyio.sleep(0.05)
    finally:
        await client.aclose()


async def test_a_killed_consumer_is_released_and_its_task_runs_once_more_in_order(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    journal = Journal(redis_client)
    jobs = [Job(n, "g", n) for n in range(4)]
    ids = await producer.enqueue_many(
        [aiogroupq.Task("work", j, group="g") for j in jobs]
    )

    def args(ready: Flag, stop: Flag) -> tuple[object, ...]:
        return (redis_url, ready, stop)

    victim: multiprocessing.process.BaseProcess
    async with spawned(_consume, args, 1) as (victim,):
        with anyio.fail_after(PATIENCE):
            while not await journal.entries():  # task 0 started on it
                await anyio.sleep(0.02)
        assert victim.pid is not None
        victim.kill()  # SIGKILL: no clean exit, its registry entry stays
        await anyio.to_thread.run_sync(victim.join, PATIENCE)
    assert victim.exitcode == -9

    # Gone at once, not alive for a lease: this host, its pid not running.
    (gone,) = await admin.consumers()
    assert (gone.pid, gone.state, gone.status) == (
        victim.pid,
        "gone",
        "gone (pid not running)",
    )
    assert (gone.in_flight, gone.alive) == (1, False)
    info = await admin.group_info("g")
    print(info.reason)  # noqa: T201
    assert f"consumer {gone.name} is gone (its process is not running" in info.reason
    assert "no consumer is alive to recover the task: start one" in info.reason
    assert f"aiogroupq release --consumer {shlex.quote(gone.name)}" in info.reason

    assert await admin.release_consumer(gone.name) == 1
    details = await admin.task(ids[0])
    assert (details.state, details.attempt) == (TaskState.QUEUED, 1)
    assert (await admin.group_info("g")).state == GroupState.READY

    # Another consumer runs it, and the rest of the group after it, in order.
    async with spawned(_consume, args, 1):
        with anyio.fail_after(PATIENCE):
            await journal.wait_done(len(jobs))
    entries = await journal.entries()
    starts = [(e.n, e.attempt) for e in entries if e.event == "start"]
    assert starts == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1)]
    ends = [e.n for e in entries if e.event == "end" and e.ok]
    assert ends == [0, 1, 2, 3]  # each exactly once, in order
    assert len({e.pid for e in entries if e.event == "start"}) == 2


# -- Redis Cluster -----------------------------------------------------------------


async def test_release_and_in_flight_on_a_cluster(cluster: ClusterProcess) -> None:
    """Each partition's recovery key is in its own slot, on its own node."""
    first = cluster.primaries()[0]
    client = RedisCluster(host="127.0.0.1", port=first.port)
    queue = "dead-consumer-cluster"
    try:
        await client.flushall(target_nodes=RedisCluster.PRIMARIES)
        async with (
            aiogroupq.Producer(client, queue=queue, partitions=3) as producer,
            aiogroupq.Admin(client, queue=queue) as admin,
        ):
            await producer.enqueue_many(
                [aiogroupq.Task("t", group=f"g{i}") for i in range(12)]
            )
            await register(
                client, "dead", host=HOST, pid=dead_pid(), keys=QueueKeys(queue)
            )
            held = [
                t.id
                for p in range(3)
                for t in await claim_as(client, "dead", QueueKeys(queue, p), 2)
            ]
            (dead,) = await admin.consumers()
            assert (dead.state, dead.in_flight) == ("gone", len(held))
            assert await admin.release_consumer("dead") == len(held)
            assert (await admin.stats()).running == 0
            assert (await consumer_named(admin, "dead")).in_flight == 0
    finally:
        await client.aclose()


async def test_a_released_task_on_its_last_attempt_is_dead_lettered_saying_why(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g", max_attempts=1)
    await register(redis_client, "dead", host=HOST, pid=dead_pid())
    await claim_as(redis_client, "dead")
    assert await admin.release_consumer("dead") == 1
    details = await admin.task(task_id)
    assert details.state == TaskState.DEAD
    assert details.error == (
        "consumer released by an operator on the last attempt (1 of 1); consumer dead"
    )


async def test_a_consumer_of_another_pid_namespace_is_not_judged_by_its_pid(
    redis_client: redis.asyncio.Redis, both: Any
) -> None:
    # A container that shares this host's network (and so its host name)
    # has pid numbers of its own: its consumer's pid means nothing here.
    _, admin = both
    await _scripts.heartbeat(
        redis_client,
        KEYS,
        [],
        lease_ms=LEASE_MS,
        consumer="boxed",
        registration=[("host", HOST), ("pid", dead_pid()), ("ns", "pid:[1]")],
    )
    (boxed,) = [c for c in await admin.consumers() if c.name == "boxed"]
    assert (boxed.state, boxed.pid_running) == ("alive", None), boxed.status
    with pytest.raises(ConsumerRunningError):
        await admin.release_consumer("boxed")
