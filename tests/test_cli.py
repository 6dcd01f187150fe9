"""The command line, run as real processes against the test server."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._cli import demo_journal as _demo_journal, demo_plan as _demo_plan
from aiogroupq.testing._server import ServerProcess, free_port

from . import example_app
from ._spawn import PATIENCE, Proc, Spawn, poll


async def _enqueue(
    client: redis.asyncio.Redis, queue: str, n: int, *, groups: int, sleep: float = 0
) -> list[str]:
    async with aiogroupq.Producer(client, queue=queue) as producer:
        return await producer.enqueue_many(
            aiogroupq.Task(
                "work",
                example_app.Item(i, sleep),
                group=f"g{i % groups}" if i % 5 else None,
            )
            for i in range(n)
        )


async def _states(
    client: redis.asyncio.Redis, queue: str, ids: Sequence[str]
) -> Counter[str]:
    async with aiogroupq.Producer(client, queue=queue) as producer:
        return Counter([str(await producer.status(i)) for i in ids])


async def _until_state(
    client: redis.asyncio.Redis,
    queue: str,
    ids: Sequence[str],
    proc: Proc,
    state: str = "succeeded",
    count: int | None = None,
) -> None:
    """Wait until *count* (default: all) of *ids* are in *state*."""

    async def reached() -> bool:
        states = await _states(client, queue, ids)
        return states[state] >= (len(ids) if count is None else count)

    await poll(reached, proc)


@pytest.mark.slow
async def test_worker_mapping_consumes_and_stops_on_sigterm(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    ids = await _enqueue(redis_client, "cli-map", 100, groups=7)
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", "cli-map",
        "--redis-url", redis_url, "--concurrency", "8",
    )  # fmt: skip
    await _until_state(redis_client, "cli-map", ids, worker)
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    assert "SIGTERM" in worker.output
    assert await _states(redis_client, "cli-map", ids) == {"succeeded": 100}


@pytest.mark.slow
async def test_sigterm_mid_flight_finishes_running_and_loses_nothing(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    queue = "cli-midflight"
    # 3 groups of 20 tasks at 50 ms each: about a second of serial work.
    ids = await _enqueue(redis_client, queue, 75, groups=3, sleep=0.05)
    args = ["worker", "tests.example_app:journaled", "--queue", queue]
    args += ["--redis-url", redis_url, "--concurrency", "4"]
    first = spawn(*args)
    await _until_state(redis_client, queue, ids, first, count=1)
    first.signal(signal.SIGTERM)
    assert await first.wait() == 0, first.output
    states = await _states(redis_client, queue, ids)
    assert set(states) <= {"succeeded", "queued"}, states  # none left running
    assert states["queued"], "the worker finished everything before SIGTERM"

    second = spawn(*args)
    await _until_state(redis_client, queue, ids, second)
    second.signal(signal.SIGINT)
    assert await second.wait() == 0, second.output
    ran = await redis_client.lrange(example_app.ran_key(queue), 0, -1)
    ran_ids = [x.decode() if isinstance(x, bytes) else x for x in ran]
    assert Counter(ran_ids) == Counter(ids)  # each exactly once


@pytest.mark.slow
async def test_factory_form(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    ids = await _enqueue(redis_client, "example", 30, groups=3)
    worker = spawn(
        "worker", "tests.example_app:make_consumer", "--redis-url", redis_url
    )
    await _until_state(redis_client, "example", ids, worker)
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output


async def _force_stop(
    client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> Counter[str]:
    """A task that never ends, a grace period of an hour, and two SIGINTs."""
    ids = await _enqueue(client, "cli-force", 1, groups=1, sleep=3600)
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", "cli-force",
        "--redis-url", redis_url, "--grace-period", "3600",
    )  # fmt: skip
    await _until_state(client, "cli-force", ids, worker, state="running")
    worker.signal(signal.SIGINT)
    await worker.wait_for_output("send it again")
    worker.signal(signal.SIGINT)
    assert await worker.wait() == 0, worker.output
    return await _states(client, "cli-force", ids)


@pytest.mark.slow
async def test_second_signal_cancels_and_hands_the_task_back(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    # Back at the front of its group, uncounted, to run again at once.
    assert await _force_stop(redis_client, redis_url, spawn) == {"queued": 1}


@pytest.mark.slow
async def test_processes_two_and_sigterm_stops_both(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    ids = await _enqueue(redis_client, "cli-procs", 200, groups=10)
    supervisor = spawn(
        "worker", "tests.example_app:handlers", "--queue", "cli-procs",
        "--redis-url", redis_url, "--processes", "2", "--concurrency", "4",
    )  # fmt: skip
    await supervisor.wait_for_output("worker ready", count=2)
    await _until_state(redis_client, "cli-procs", ids, supervisor)
    ready = re.findall(r"\[(\d+)\] aiogroupq.cli: worker ready", supervisor.output)
    pids = {int(pid) for pid in ready}
    assert len(pids) == 2, supervisor.output
    assert supervisor.popen.pid not in pids
    supervisor.signal(signal.SIGTERM)
    assert await supervisor.wait() == 0, supervisor.output
    assert supervisor.output.count("SIGTERM: finishing") == 2, supervisor.output
    for pid in pids:  # both children were stopped and reaped by the supervisor
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
async def test_processes_report_a_failed_child(spawn: Spawn) -> None:
    supervisor = spawn(
        "worker", "tests.example_app:handlers", "--queue", "q", "--processes", "2",
        "--redis-url", "nope://localhost",
    )  # fmt: skip
    assert await supervisor.wait() == 2, supervisor.output
    assert "unusable Redis URL" in supervisor.output


@pytest.mark.slow
async def test_worker_started_before_redis_waits_for_it_then_consumes(
    tmp_path: Path, spawn: Spawn
) -> None:
    # A worker often starts before its Redis (containers, boot order). It
    # used to exit 1 at once; now it retries with backoff, saying where it
    # tries (password masked), and is ready as soon as the server is.
    (tmp_path / "late").mkdir()
    server = ServerProcess(  # a free port, nothing there yet
        workdir=tmp_path / "late",
        port=free_port(),
        config={"user": ["worker", "on", ">hunter2", "~*", "&*", "+@all"]},
    )
    url = f"redis://worker:hunter2@127.0.0.1:{server.port}/0"
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", "cli-late",
        "--redis-url", url,
    )  # fmt: skip
    await worker.wait_for_output("is unreachable", count=2)  # it keeps trying
    masked = f"redis://worker:***@127.0.0.1:{server.port}/0"
    assert re.search(
        rf"WARNING .* Redis at {re.escape(masked)} is unreachable", (worker.output)
    ), worker.output
    server.start()
    client = redis.asyncio.Redis(port=server.port)
    try:
        await worker.wait_for_output("worker ready")
        ids = await _enqueue(client, "cli-late", 20, groups=3)
        await _until_state(client, "cli-late", ids, worker)
        worker.signal(signal.SIGTERM)
        assert await worker.wait() == 0, worker.output
    finally:
        await client.aclose()
        server.stop()
    assert "hunter2" not in worker.output


@pytest.mark.slow
async def test_worker_stopped_while_waiting_for_redis_exits_0(spawn: Spawn) -> None:
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", "q",
        "--redis-url", f"redis://:hunter2@127.0.0.1:{free_port()}/0",
    )  # fmt: skip
    await worker.wait_for_output("is unreachable")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    assert "hunter2" not in worker.output


@pytest.mark.parametrize(
    ("userinfo", "db", "message"),
    [
        ("nobody:hunter2@", 0, "Redis refused the credentials"),
        ("", 99, "Redis refused the database number"),
    ],
)
async def test_worker_exits_2_at_once_on_bad_credentials_or_database(
    redis_url: str, spawn: Spawn, userinfo: str, db: int, message: str
) -> None:
    # Configuration, not a transient failure: no retrying, a one-line error.
    # (Refused credentials used to be retried as a connection error.)
    url = redis_url.replace("redis://", f"redis://{userinfo}").rsplit("/", 1)[0]
    worker = spawn(
        "worker", "tests.example_app:handlers", "--queue", "q",
        "--redis-url", f"{url}/{db}",
    )  # fmt: skip
    assert await worker.wait(timeout=PATIENCE) == 2, worker.output
    assert "is unreachable" not in worker.output
    lines = worker.output.strip().splitlines()
    assert lines[-1].startswith("aiogroupq worker: error: Redis at "), worker.output
    assert message in lines[-1]
    assert "hunter2" not in worker.output


@pytest.mark.parametrize(
    ("userinfo", "db", "message"),
    [
        ("nobody:hunter2@", "0", "Redis refused the credentials"),
        ("", "99", "Redis refused the database number"),
        (":hunter2@", "down", "Redis is unreachable"),
    ],
)
async def test_check_reports_connection_errors_in_one_line(
    redis_url: str, spawn: Spawn, userinfo: str, db: str, message: str
) -> None:
    # A bad database leaked a traceback; refused credentials were retried
    # for seconds and then reported as "Redis is unreachable".
    base = redis_url.replace("redis://", f"redis://{userinfo}").rsplit("/", 1)[0]
    if db == "down":
        base = f"redis://{userinfo}127.0.0.1:{free_port()}"
        db = "0"
    proc = spawn("check", "--queue", "q", "--redis-url", f"{base}/{db}")
    assert await proc.wait() == 2, proc.output
    lines = proc.output.strip().splitlines()
    assert len(lines) == 1, proc.output
    assert lines[0].startswith("aiogroupq check: error: Redis at "), proc.output
    assert message in lines[0]
    assert "hunter2" not in proc.output


@pytest.mark.parametrize(
    ("target", "extra", "message"),
    [
        ("tests.no_such_module:handlers", [], "cannot import module"),
        ("tests.example_app:missing", [], "has no attribute 'missing'"),
        ("tests.example_app", [], "expected module:attr"),
        ("tests.example_app:not_a_target", [], "expected a mapping"),
        ("tests.example_app:handlers", [], "--queue is required"),
        ("tests.example_app:sync_handlers", ["--queue", "q"], "must be an async"),
        ("tests.example_app:Item", [], "must accept the keyword arguments"),
        ("tests.example_app:make_consumer", ["--lease-ttl", "5"], "apply to a mapping"),
    ],
)
async def test_bad_target_exits_2_with_one_line(
    target: str, extra: list[str], message: str, spawn: Spawn
) -> None:
    proc = spawn("worker", target, *extra, "--redis-url", "redis://127.0.0.1:1/0")
    assert await proc.wait() == 2
    lines = proc.output.strip().splitlines()
    assert len(lines) == 1, proc.output
    assert lines[0].startswith("aiogroupq worker: error: "), proc.output
    assert message in lines[0]


async def test_help(spawn: Spawn) -> None:
    proc = spawn("worker", "--help")
    assert await proc.wait() == 0
    assert "module:attr" in proc.output
    assert "factory(*, redis_url, queue, concurrency)" in proc.output


@pytest.mark.slow
async def test_demo_verifies_a_run(redis_url: str, spawn: Spawn) -> None:
    demo = spawn(
        "demo", "--redis-url", redis_url, "--tasks", "2000", "--groups", "200",
        "--processes", "2",
    )  # fmt: skip
    assert await demo.wait(timeout=120) == 0, demo.output
    for line in (
        r"tasks run:\s+2,000 of 2,000$",
        r"tasks run more than once:\s+0$",
        r"tasks never run:\s+0$",
        r"order violations:\s+0$",
        r"overlapping runs:\s+0$",
        r"final states:\s+succeeded 2,000$",
        r"throughput:\s+[\d,]+ tasks/s",
        r"elapsed:\s+[\d.]+ s",
        r"result:\s+OK$",
    ):
        assert re.search(line, demo.output, re.MULTILINE), (line, demo.output)


# -- the demo's checks can fail -------------------------------------------------


def _journal(
    events: Sequence[tuple[str, int]], jobs: Sequence[_demo_plan.Job]
) -> list[bytes]:
    out = []
    for clock, (event, i) in enumerate(events, 1):
        job = jobs[i]
        out.append(
            f"{clock} 100 {clock} {event} {i} {job.seq} 1 {job.group or '-'}".encode()
        )
    return out


JOBS = [
    _demo_plan.Job(0, "a", 0, 0, "import_rows"),
    _demo_plan.Job(1, "a", 1, 0, "import_rows"),
    _demo_plan.Job(2, None, 0, 0, "send_mail"),
]


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([("s", 0), ("e", 0), ("s", 1), ("e", 1), ("s", 2), ("e", 2)], None),
        ([("s", 2), ("s", 0), ("e", 2), ("e", 0), ("s", 1), ("e", 1)], None),
        (
            [("s", 1), ("e", 1), ("s", 0), ("e", 0), ("s", 2), ("e", 2)],
            "order_violations",
        ),
        ([("s", 0), ("s", 1), ("e", 0), ("e", 1), ("s", 2), ("e", 2)], "overlaps"),
        ([("s", 0), ("e", 0), ("s", 1), ("e", 1)], "never_ran"),
        ([("s", 0), ("e", 0), ("s", 1), ("e", 1), ("s", 2), ("s", 2)], "ran_twice"),
        ([("s", 0), ("e", 0), ("s", 1), ("s", 2), ("e", 2)], "unfinished"),
    ],
)
def test_demo_verify_catches(events: list[tuple[str, int]], field: str | None) -> None:
    verdict = _demo_journal.verify(JOBS, _journal(events, JOBS))
    assert verdict.ok is (field is None)
    if field is not None:
        assert getattr(verdict, field) >= 1, verdict


def test_demo_verify_catches_a_foreign_record() -> None:
    journal = _journal(
        [("s", 0), ("e", 0), ("s", 1), ("e", 1), ("s", 2), ("e", 2)], JOBS
    )
    journal[0] = journal[0].replace(b" a", b" b")  # task 0 claims another group
    assert _demo_journal.verify(JOBS, journal).order_violations == 1


def test_demo_plan_shape() -> None:
    import random

    jobs, _ = _demo_plan.make_plan(20_000, 2_000, random.Random(1))
    groups = Counter(job.group for job in jobs)
    assert len(jobs) == 20_000
    assert groups[None] == 4_000
    assert len(groups) - 1 == 2_000
    assert sorted(groups.values())[-4:-1] == [1_000] * 3
    seqs: dict[str | None, list[int]] = {}
    for job in jobs:
        seqs.setdefault(job.group, []).append(job.seq)
    for group, got in seqs.items():
        if group is not None:
            assert got == list(range(len(got)))


def test_name_applies_to_a_mapping_only(redis_url: str) -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "aiogroupq", "worker"),
            *("tests.example_app:make_consumer", "--redis-url", redis_url),
            *("--name", "w"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--name apply to a mapping" in result.stderr
