"""Chaos tests (``pytest tests/chaos -m chaos``; ``AIOGROUPQ_CHAOS_SCALE=full``
for the documented figures). Each runs real consumer processes against a real
server, injects one kind of fault, then judges the journal of every handler
start and end (``_oracle.py``) and the queue's keys (``aiogroupq._check.check``), and
prints its figures (see ``conftest.py``).

Targeted tests pin one promise each: a task interrupted by ``kill -9`` runs
again first in its group within ``lease_ttl`` + a bound; a consumer restarted
with the same name resumes at once; a consumer stalled past its lease
(SIGSTOP) has its handler cancelled and its acknowledgement refused; a
graceful exit (SIGTERM) with tasks in flight loses and duplicates nothing.
The random tests run a workload of grouped and ungrouped tasks through 4
consumer processes while one fault type strikes at random moments (and once
all of them, mixed). The last tests pin library bugs this suite found (all
fixed since): a lost reply the producer must ride out, and a re-claimed task
whose earlier attempt's refused outcome must not make its consumer forget it.

No timing is asserted except the liveness bound of invariant 5.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import FullJitterBackoff

import aiogroupq

from ._harness import (
    MAX_ATTEMPTS,
    QUEUE,
    RECOVERY_BOUND,
    Cluster,
    Result,
    chaos_scale,
    chaos_seed,
    drive,
    workload,
)
from ._journal import JOURNAL
from ._oracle import Spec, parse
from ._worker import Job

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

Report = Callable[[Result], None]


def _stats(workdir: Path, pid: int) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((workdir / f"stats-{pid}.json").read_text())
    return loaded


def _assert_recovery(result: Result) -> None:
    bound = result.lease_ttl + RECOVERY_BOUND
    slow = [s for s in result.verdict.recovery if s > bound]
    assert not slow, f"recovery slower than lease_ttl + {RECOVERY_BOUND}s: {slow}"


# -- targeted ------------------------------------------------------------------


async def test_kill_mid_task_reruns_first_in_its_group(
    tmp_path: Path, chaos_report: Report
) -> None:
    """kill -9 while a grouped and an ungrouped task run: both run again
    (attempt + 1), the grouped one before any later task of its group, within
    lease_ttl + the bound, on a consumer with another name."""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=1) as c:
        jobs = [
            Job(0, "g", 0, 3000),
            Job(1, "g", 1, 10),
            Job(2, "g", 2, 10),
            Job(3, None, 0, 3000),
        ]
        await c.produce(jobs, 0)
        await c.wait_started({0, 3})
        await c.kill(c.workers[0], same_name=False)
        result = await c.settle("targeted: kill -9 mid-task")
    chaos_report(result)
    result.assert_clean()
    v = result.verdict
    assert v.interrupted == 2
    assert v.resumed_first == 2
    assert v.attempt_plus_one == 2
    _assert_recovery(result)


async def test_restart_with_same_name_resumes_at_once(
    tmp_path: Path, chaos_report: Report
) -> None:
    """With a 30 s lease, a consumer killed and restarted under its name
    resumes its in-flight task long before the lease could expire."""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=1, lease_ttl=30.0) as c:
        await c.produce([Job(0, "g", 0, 2000), Job(1, "g", 1, 10)], 0)
        await c.wait_started({0})
        await c.kill(c.workers[0], same_name=True)
        result = await c.settle("targeted: restart with the same name")
    chaos_report(result)
    result.assert_clean()
    v = result.verdict
    assert (v.interrupted, v.resumed_first, v.attempt_plus_one) == (1, 1, 1)
    # "At once": a process start, far below the 30 s lease.
    assert max(v.recovery_same) < 10.0


async def test_stalled_consumer_is_cancelled_and_its_ack_refused(
    tmp_path: Path, chaos_report: Report
) -> None:
    """SIGSTOP a consumer mid-task for 2.5 x lease_ttl: the other consumer
    takes the group over (attempt 2); after SIGCONT the stalled handler is
    cancelled, its outcome refused, and the group never had two holders."""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=2, lease_ttl=1.0) as c:
        await c.produce([Job(0, "g", 0, 4000), Job(1, "g", 1, 10)], 0)
        pid = (await c.wait_started({0}))[0]
        await c.stall(c.worker(pid), 2.5 * c.lease_ttl)
        result = await c.settle("targeted: SIGSTOP past the lease")
        stats = _stats(tmp_path, pid)
    chaos_report(result)
    result.assert_clean()
    v = result.verdict
    assert (v.stalled_runs, v.stalled_taken_over) == (1, 1)
    # It was mid-sleep at SIGCONT: cancelled there, its record refused.
    assert v.stalled_cancelled == 1
    assert v.fenced_overlaps["stalled (SIGSTOP)"] == 1
    assert stats["lease_lost"] == 1, stats


async def test_graceful_exit_loses_and_duplicates_nothing(
    tmp_path: Path, chaos_report: Report
) -> None:
    """SIGTERM with two tasks running and one waiting: the short one finishes
    within the grace period, the long one is handed back uncounted and runs
    again (same attempt) on the next consumer; nothing runs twice to the end."""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=1, grace=1.0) as c:
        await c.produce(
            [Job(0, "g", 0, 3000), Job(1, "g", 1, 10), Job(2, None, 0, 300)], 0
        )
        await c.wait_started({0, 2})
        code = await c.terminate(c.workers[0])
        result = await c.settle("targeted: SIGTERM with tasks in flight")
    chaos_report(result)
    assert code == 0
    result.assert_clean()
    v = result.verdict
    assert (v.terminated_open, v.handed_back, v.finished_in_grace) == (2, 1, 1)
    assert v.runs == 4  # 0 twice (handed back), 1 and 2 once


# -- random faults under load --------------------------------------------------------


async def test_random_consumer_kills(tmp_path: Path, chaos_report: Report) -> None:
    """T1: kill -9 a random consumer every U(0.5, 1.5) s, restarting it at once,
    half the time under the same name."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed()) as c:

        async def kill() -> None:
            w = c.pick()
            if w is not None:
                await c.kill(w, same_name=c.rng.random() < 0.5)

        jobs = workload(scale.tasks, c.rng)
        kills = await drive(
            c, jobs, scale.kills * 1.0, kill, times=scale.kills, interval=(0.5, 1.5)
        )
        result = await c.settle("kill -9 consumers")
    chaos_report(result)
    assert kills >= scale.kills
    result.assert_clean()
    v = result.verdict
    assert v.resumed_first == v.interrupted
    assert v.attempt_plus_one == v.interrupted
    _assert_recovery(result)


async def test_random_stalls(tmp_path: Path, chaos_report: Report) -> None:
    """T2: SIGSTOP a random consumer for U(1.1, 2.5) x lease_ttl, then
    SIGCONT it; a tenth of the tasks take 0.5-2.5 s, so that a group taken
    over during the stall is often still running at SIGCONT."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed()) as c:

        async def stall() -> None:
            w = c.pick(ready=True)
            if w is not None:
                await c.stall(w, c.rng.uniform(1.1, 2.5) * c.lease_ttl)

        jobs = workload(scale.tasks, c.rng, long_fraction=0.1, long_ms=(500, 2500))
        await drive(
            c, jobs, scale.stalls * 2.8, stall, times=scale.stalls, interval=(0.3, 1.0)
        )
        result = await c.settle("SIGSTOP consumers (1.1-2.5 x lease)")
    chaos_report(result)
    result.assert_clean()
    v = result.verdict
    # Every stalled run that another consumer took over was cancelled after
    # SIGCONT or had its late write refused: none was applied.
    assert v.stalled_cancelled + v.stalled_refused == v.stalled_taken_over


async def test_random_graceful_exits(tmp_path: Path, chaos_report: Report) -> None:
    """SIGTERM a random consumer (grace period 1 s; some tasks take 1.5-3 s)
    and start a new one."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed(), grace=1.0) as c:
        codes: list[int] = []

        async def term() -> None:
            w = c.pick(ready=True)
            if w is not None:
                codes.append(await c.terminate(w))

        jobs = workload(scale.tasks, c.rng, long_fraction=0.02, long_ms=(1500, 3000))
        await drive(
            c, jobs, scale.terms * 2.5, term, times=scale.terms, interval=(0.5, 1.5)
        )
        result = await c.settle("SIGTERM consumers")
    chaos_report(result)
    assert set(codes) == {0}
    result.assert_clean()
    assert not result.verdict.reruns.keys() - {"handback"}


async def test_random_connection_drops(tmp_path: Path, chaos_report: Report) -> None:
    """T4: through a TCP proxy (a link per consumer), every U(0.2, 1.0) s:
    reset every connection, cut one reply mid-way, cut one consumer off
    Redis for 1.5 x lease_ttl (a partition: its handlers must stop by
    themselves before another consumer takes their groups), or black-hole
    all traffic as long."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed(), proxy=True) as c:

        async def drop() -> None:
            how = c.rng.choices(
                ["reset", "cut", "partition", "pause"], [0.45, 0.3, 0.15, 0.1]
            )[0]
            await c.drop(how)

        # A tenth of the tasks take 0.5-2.5 s: a partitioned consumer must
        # cancel them itself before their groups are taken over.
        jobs = workload(scale.tasks, c.rng, long_fraction=0.1, long_ms=(500, 2500))
        await drive(
            c, jobs, scale.drops * 0.8, drop, times=scale.drops, interval=(0.2, 1.0)
        )
        result = await c.settle("dropped connections (proxy)")
        assert c.proxy is not None
        result.extra["proxy"] = {
            "resets": c.proxy.resets,
            "cuts": c.proxy.cuts,
            "pauses": c.proxy.pauses,
        }
    chaos_report(result)
    result.assert_clean()


@pytest.mark.parametrize("appendfsync", ["always", "everysec"])
async def test_random_redis_restarts(
    tmp_path: Path, chaos_report: Report, appendfsync: str
) -> None:
    """T3: kill -9 the Redis server every U(1.5, 3) s and start it again on
    the same port and directory, AOF on; consumers reconnect by themselves."""
    scale = chaos_scale()
    async with Cluster(
        tmp_path, seed=chaos_seed(), appendonly=True, appendfsync=appendfsync
    ) as c:
        jobs = workload(scale.tasks, c.rng)
        await drive(
            c,
            jobs,
            scale.restarts * 2.8,
            c.restart_redis,
            times=scale.restarts,
            interval=(1.5, 3.0),
        )
        result = await c.settle(f"kill -9 redis-server (AOF {appendfsync})")
    chaos_report(result)
    result.assert_clean()


async def test_random_redis_freezes(tmp_path: Path, chaos_report: Report) -> None:
    """SIGSTOP the Redis server for 2 x lease_ttl every U(1, 2) s: every lease
    expires on the server's clock meanwhile; consumers must have stopped their
    handlers by then (their local lease deadline), and what they sent runs
    late, all at once."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed()) as c:
        jobs = workload(scale.tasks, c.rng)

        async def freeze() -> None:
            await c.freeze_redis(2 * c.lease_ttl)

        await drive(
            c,
            jobs,
            scale.restarts * 3.5,
            freeze,
            times=scale.restarts,
            interval=(1.0, 2.0),
        )
        result = await c.settle("SIGSTOP redis-server (2 x lease)")
    chaos_report(result)
    result.assert_clean()


async def test_random_mixed_faults(tmp_path: Path, chaos_report: Report) -> None:
    """Every fault above at random, one after another every U(0.3, 1.2) s:
    consumer kill -9 (same or new name), SIGSTOP, SIGTERM, connection resets,
    cut replies, partitions, Redis kill -9 and restart (AOF always), Redis
    SIGSTOP, FUNCTION FLUSH with SCRIPT FLUSH."""
    scale = chaos_scale()
    async with Cluster(
        tmp_path, seed=chaos_seed(), appendonly=True, proxy=True, grace=1.0
    ) as c:

        async def fault() -> None:
            kind = c.rng.choice(
                [
                    "kill",
                    "stall",
                    "term",
                    "reset",
                    "cut",
                    "partition",
                    "restart",
                    "freeze",
                    "flush",
                ]
            )
            w = c.pick(ready=kind in ("stall", "term"))
            if kind == "kill" and w is not None:
                await c.kill(w, same_name=c.rng.random() < 0.5)
            elif kind == "stall" and w is not None:
                await c.stall(w, c.rng.uniform(1.1, 2.5) * c.lease_ttl)
            elif kind == "term" and w is not None:
                await c.terminate(w)
            elif kind in ("reset", "cut", "partition"):
                await c.drop(kind)
            elif kind == "restart":
                await c.restart_redis()
            elif kind == "freeze":
                await c.freeze_redis(2 * c.lease_ttl)
            elif kind == "flush":
                await c.flush_caches()

        jobs = workload(scale.tasks, c.rng, long_fraction=0.05, long_ms=(300, 2000))
        await drive(
            c,
            jobs,
            scale.kills * 2.0,
            fault,
            times=scale.kills * 2,
            interval=(0.3, 1.2),
        )
        result = await c.settle("all of the above, mixed")
    chaos_report(result)
    result.assert_clean()
    _assert_recovery(result)


async def test_random_flushes(tmp_path: Path, chaos_report: Report) -> None:
    """T5: FUNCTION FLUSH and SCRIPT FLUSH every U(0.1, 0.3) s under load."""
    scale = chaos_scale()
    async with Cluster(tmp_path, seed=chaos_seed()) as c:
        jobs = workload(scale.tasks, c.rng)
        await drive(
            c,
            jobs,
            scale.flushes * 0.2,
            c.flush_caches,
            times=scale.flushes,
            interval=(0.1, 0.3),
        )
        result = await c.settle("FUNCTION FLUSH + SCRIPT FLUSH")
    chaos_report(result)
    result.assert_clean()
    assert result.verdict.reruns.total() == 0  # a flush costs a reload, no re-run


async def _enqueue_through_cuts(
    c: Cluster, producer: aiogroupq.Producer, n: int
) -> tuple[int, list[int]]:
    """Enqueue *n* one-millisecond tasks, cutting the reply to each; wait
    until each ran; return (replies cut, the tasks that ran to the end twice)."""
    assert c.proxy is not None
    for seq in range(n):
        c.proxy.cut_next_reply(c.producer_url)
        task_id = await producer.enqueue(
            "job", Job(seq, None, 0, 1), max_attempts=MAX_ATTEMPTS
        )
        c.specs[seq] = Spec(task_id, None, 0)
        await anyio.sleep(0.05)
    with anyio.fail_after(60):
        while len(_completed(await c.client.lrange(JOURNAL, 0, -1))) < n:
            await anyio.sleep(0.1)
    await anyio.sleep(1.0)  # a second run would have started by now
    completed = _completed(await c.client.lrange(JOURNAL, 0, -1))
    return c.proxy.cuts, sorted(seq for seq, k in completed.items() if k > 1)


def _completed(lines: list[bytes | str]) -> Counter[int]:
    """Runs that ended with a fresh E, per task."""
    return Counter(int(e.fields[3]) for e in parse(lines) if e.kind == "E" and e.fresh)


async def test_producer_rides_out_a_lost_reply(tmp_path: Path) -> None:
    """The reply to an enqueue is cut mid-way: the producer's client re-sends
    the same EVALSHA (same client-made id, a no-op the second time) instead
    of raising; the task runs once. (Producer.enqueue promises about 5 s of
    retries before RedisUnavailableError.) Found by this suite: the clients
    aiogroupq made were given redis-py's synchronous Retry, which never
    retried an asyncio command."""
    async with (
        Cluster(tmp_path, seed=chaos_seed(), workers=2, proxy=True) as c,
        aiogroupq.Producer(c.producer_url, queue=QUEUE) as producer,
    ):
        cuts, twice = await _enqueue_through_cuts(c, producer, 20)
    print(f"[lost enqueue reply] {cuts} cut, ran twice: {twice}")  # noqa: T201
    assert not twice


async def test_resent_enqueue_runs_a_task_once(tmp_path: Path) -> None:
    """With a client that does re-send after a lost reply (redis-py's asyncio
    Retry, as aiogroupq means to configure its own, or a user's borrowed
    client), a re-sent enqueue must not create the task again, even when it
    already ran meanwhile and its consumer keeps no state (``retention=0``:
    a minute is kept anyway, for this)."""
    async with Cluster(
        tmp_path, seed=chaos_seed(), workers=2, proxy=True, retention=0.0
    ) as c:
        client = redis.asyncio.Redis.from_url(
            c.producer_url,
            socket_timeout=10,
            retry=AsyncRetry(FullJitterBackoff(cap=1.0, base=0.05), 6),
        )
        try:
            async with aiogroupq.Producer(client, queue=QUEUE) as producer:
                cuts, twice = await _enqueue_through_cuts(c, producer, 60)
        finally:
            await client.aclose()
    print(  # noqa: T201
        f"[re-sent enqueue] 60 enqueues, {cuts} replies cut, "
        f"tasks run to the end twice: {len(twice)} {twice}"
    )
    assert not twice, f"{len(twice)} of 60 tasks ran twice after a re-sent enqueue"


async def test_a_live_consumer_keeps_its_name_through_an_outage(
    tmp_path: Path,
) -> None:
    """A consumer's explicit name is held by a key its heartbeats renew. When
    Redis is away longer than that hold (here a restart of 2 x lease_ttl),
    the hold lapses; once Redis is back the live consumer must hold its name
    again, so that a second process started under the same name is refused
    (two live consumers sharing a name give back each other's running
    tasks: a group would run twice at once). (Found by this suite: the
    renewal of a lapsed hold used to answer "renewed" without taking it
    back.)"""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=1, appendonly=True) as c:
        a = c.workers[0]
        key = f"{{aiogroupq:{QUEUE}}}:consumer:{a.name}"
        assert await c.client.get(key) is not None
        await c.restart_redis(down=2 * c.lease_ttl)
        await anyio.sleep(3 * c.lease_ttl)  # several heartbeats since
        holder = await c.client.get(key)
        twin = await c.spawn(a.name)
        with anyio.move_on_after(3 * c.lease_ttl + 10):
            while twin.proc.poll() is None and not c.ready(twin):
                await anyio.sleep(0.05)
        twin_started = c.ready(twin)
        print(  # noqa: T201
            f"[name after an outage] holder {holder!r}; a second process named "
            f"{a.name!r} {'STARTED' if twin_started else 'was refused'}"
        )
        assert holder is not None, "the live consumer's name hold lapsed for good"
        assert not twin_started, "two live consumers now share a name"


async def test_reclaimed_task_keeps_its_lease_after_an_outage(
    tmp_path: Path, chaos_report: Report
) -> None:
    """Redis stalls (SIGSTOP) past the lease while one consumer runs three
    long tasks: they are cancelled (their leases expired) and the consumer
    claims them again itself, while their refused outcomes are still being
    recorded. The new runs must then be heartbeated like any other: with
    Redis healthy again, none may lose its lease. Found by this suite: the
    refused outcome made the consumer forget the task by its id, so the new
    attempt lost its heartbeats."""
    async with Cluster(tmp_path, seed=chaos_seed(), workers=1, concurrency=8) as c:
        await c.produce([Job(i, f"a{i}", 0, 3000) for i in range(3)], 0)
        await c.wait_started({0, 1, 2})
        await c.freeze_redis(2.5 * c.lease_ttl)
        result = await c.settle("targeted: re-claim after a Redis stall")
        events = parse((tmp_path / "journal.txt").read_bytes().split(b"\n"))
    chaos_report(result)
    result.assert_clean()
    thaw = max(e.clock for e in events if e.kind == "RU")
    cancelled_later = [e for e in events if e.kind == "C" and e.clock > thaw]
    attempts = max(int(e.fields[6]) for e in events if e.kind == "S")
    print(  # noqa: T201
        f"[re-claim after a stall] runs cancelled with Redis healthy: "
        f"{len(cancelled_later)}; highest attempt {attempts}"
    )
    assert not cancelled_later, "re-claimed runs lost their leases (no heartbeat)"
    assert attempts == 2


async def test_reconcile_never_gives_back_a_running_task(
    tmp_path: Path, chaos_report: Report
) -> None:
    """After a Redis stall the consumer re-claims its own long task; then one
    of its claims loses its reply (cut by the proxy), so it reconciles: it
    gives back what it holds but does not run. The task it runs must stay
    with it: its group must never run twice at once. Found by this suite
    (the forgotten re-claimed run above was given back while it ran)."""
    async with Cluster(
        tmp_path, seed=chaos_seed(), workers=1, concurrency=8, proxy=True
    ) as c:
        assert c.proxy is not None
        a = c.workers[0]
        await c.produce([Job(0, "g", 0, 5000), Job(1, "g", 1, 10)], 0)
        await c.wait_started({0})
        await c.freeze_redis(2.5 * c.lease_ttl)
        with anyio.fail_after(10):  # the re-claim, and the old outcome refused
            while "refused: its lease was lost" not in a.log.read_text():
                await anyio.sleep(0.01)
        seen = len(a.log.read_text())
        with anyio.move_on_after(2):  # cut replies until a claim's is cut
            while "claim failed" not in a.log.read_text()[seen:]:
                c.proxy.cut_next_reply(a.url)
                await c.client.rpush(f"{{aiogroupq:{QUEUE}}}:wake", "1")
                await anyio.sleep(0.01)
        reconciled = "claim failed" in a.log.read_text()[seen:]
        result = await c.settle("targeted: reconcile after a lost claim reply")
    chaos_report(result)
    assert reconciled, "no claim reply could be cut: the scenario did not happen"
    result.assert_clean()
