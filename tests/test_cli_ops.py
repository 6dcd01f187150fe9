"""The operator commands, each run as a real ``python -m aiogroupq`` process
against the test server: human output, ``--json``, exit statuses.

States are set up with the real scripts; what a command prints is compared
with what the API reads from the same server.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import GroupState
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

if TYPE_CHECKING:
    from ._roles import Both

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "ops"
KEYS = QueueKeys(QUEUE)
LEASE_MS = 60_000
#: every operator command, with the arguments --help needs
COMMANDS = (
    ["stats"], ["groups"], ["group", "g"], ["task", "x"], ["consumers"],
    ["dead"], ["dead", "list"], ["dead", "show", "x"], ["dead", "requeue"],
    ["dead", "purge"], ["release", "g"], ["pause"], ["resume"], ["cancel", "x"],
    ["repartition"],
)  # fmt: skip


class Run:
    """A finished ``python -m aiogroupq`` process."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)

    def __repr__(self) -> str:
        return f"Run({self.code}, out={self.out!r}, err={self.err!r})"


async def cli(*args: str, url: str | None = None, queue: str | None = QUEUE) -> Run:
    argv = [sys.executable, "-m", "aiogroupq", *args]
    if queue is not None:
        argv += ["--queue", queue]
    if url is not None:
        argv += ["--redis-url", url]
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(argv, check=False, cwd=ROOT)
    run = Run(done.returncode, done.stdout.decode(), done.stderr.decode())
    print(f"$ aiogroupq {' '.join(args)}\n{run.out}{run.err}")  # noqa: T201
    return run


async def claim(client: redis.asyncio.Redis, k: int = 1) -> list[_scripts.Claimed]:
    reply = await _scripts.claim(
        client, KEYS, "c1", k=k, lease_ms=LEASE_MS, scan_limit=k + 10
    )
    return reply.tasks


async def finish(
    client: redis.asyncio.Redis,
    tasks: Sequence[_scripts.Claimed],
    kind: _scripts.OutcomeKind,
) -> None:
    reason = "ValueError: bad row" if kind in ("dead", "halt") else ""
    outcomes = [
        _scripts.Outcome(t.id, t.token, kind, reason, "Traceback") for t in tasks
    ]
    codes = await _scripts.finish(client, KEYS, outcomes, retention_ms=60_000)
    assert codes == [1] * len(tasks)


async def dead_letters(
    client: redis.asyncio.Redis, producer: aiogroupq.Producer, n: int
) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 500):
        batch = [aiogroupq.Task("t", max_attempts=1)] * min(500, n - start)
        ids += await producer.enqueue_many(batch)
        await finish(client, await claim(client, len(batch)), "dead")
    return ids


def value(out: str, label: str) -> str:
    """The value after ``label:`` in a page of fields."""
    found = re.search(rf"^\s*{re.escape(label)}:?\s+(\S+)", out, re.MULTILINE)
    assert found, f"no {label!r} in {out!r}"
    return found.group(1)


# -- the command line itself ---------------------------------------------------


async def test_version() -> None:
    run = await cli("--version", queue=None)
    assert run.code == 0
    assert run.out.strip() == f"aiogroupq {aiogroupq.__version__}"


@pytest.mark.parametrize(
    "command", [[], ["worker", "x"], ["check"], ["server"], *COMMANDS]
)
async def test_help_has_no_rest_markup(command: list[str]) -> None:
    run = await cli(*command, "--help", queue=None)
    assert run.code == 0
    assert "usage: aiogroupq" in run.out
    for markup in ("``", ":param", ":class:", ":meth:", ":func:", ".. "):
        assert markup not in run.out


async def test_a_queue_is_required_and_checked(redis_url: str) -> None:
    run = await cli("stats", url=redis_url, queue=None)
    assert run.code == 2
    assert "--queue is required" in run.err
    run = await cli("stats", url=redis_url, queue="no spaces")
    assert run.code == 2
    assert "queue name" in run.err


async def test_an_unreachable_redis_exits_2() -> None:
    run = await cli("stats", url="redis://127.0.0.1:1/0")
    assert run.code == 2
    assert "error" in run.err
    assert "Traceback" not in run.err


async def test_a_queue_that_does_not_exist_is_named(redis_url: str) -> None:
    for command in (["stats"], ["groups"], ["group", "g"], ["consumers"]):
        run = await cli(*command, url=redis_url, queue="typo")
        assert run.code == 1, run
        assert "queue 'typo' does not exist" in run.err
    run = await cli("stats", "--json", url=redis_url, queue="typo")
    assert run.code == 1
    assert run.json()["exists"] is False


async def test_a_misspelt_queue_gets_did_you_mean(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    # As aiogroupq check says it: the operator commands said only "does
    # not exist".
    for queue in ("orders", "orders-eu", "billing"):
        async with aiogroupq.Producer(redis_client, queue=queue) as producer:
            await producer.enqueue("t")
    for command in (["stats"], ["groups"], ["pause"]):
        run = await cli(*command, url=redis_url, queue="ordrs")
        assert run.code == 1, run
        assert "queue 'ordrs' does not exist" in run.err
        assert run.err.rstrip().endswith("; did you mean 'orders' or 'orders-eu'?")
    run = await cli("stats", url=redis_url, queue="zzzzzz")
    assert run.code == 1, run
    assert "did you mean" not in run.err


# -- reading -------------------------------------------------------------------


async def test_stats_human_and_json(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 3)
    await producer.enqueue("t", delay=60)
    await claim(redis_client)
    await dead_letters(redis_client, producer, 2)
    run = await cli("stats", url=redis_url)
    assert run.code == 0
    assert f"queue {QUEUE!r} (running)" in run.out
    figures = {
        label: value(run.out, label)
        for label in ("ready", "parked", "delayed", "running", "dead", "enqueued")
    }
    assert figures == {
        "ready": "0",
        "parked": "2",
        "delayed": "1",
        "running": "1",
        "dead": "2",
        "enqueued": "6",
    }
    run = await cli("stats", "--json", url=redis_url)
    assert run.code == 0
    data, want = run.json(), await admin.stats()
    for name in ("ready", "parked", "held", "delayed", "running", "dead", "groups"):
        assert data[name] == getattr(want, name)
    assert data["totals"] == dict(want.totals)


async def test_stats_watch_refreshes_with_rates(redis_url: str, both: Both) -> None:
    await both[0].enqueue("t")
    run = await cli(
        "stats", "--watch", "--interval", "0.1", "--count", "3", url=redis_url
    )
    assert run.code == 0
    assert run.out.count(f"queue {QUEUE!r}") == 3
    assert run.out.count("/s") >= 2 * 8  # every total, on the 2nd and 3rd page
    run = await cli(
        "stats", "--watch", "--json", "--interval", "0.1", "--count", "2", url=redis_url
    )
    lines = run.out.splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["totals"]["enqueued"] for line in lines] == [1, 1]


async def test_groups_and_group(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    for i in range(5):
        await producer.enqueue_many([aiogroupq.Task("t", group=f"g{i}")] * (i + 2))
    await claim(redis_client)  # g0's head runs: g0 is at its cap
    run = await cli("groups", "--limit", "3", url=redis_url)
    assert run.code == 0
    lines = run.out.splitlines()
    assert lines[0].split()[:5] == ["GROUP", "STATE", "RUNNING", "BACKLOG", "OLDEST"]
    assert [line.split()[0] for line in lines[1:4]] == ["g4", "g3", "g2"]
    assert "next page: --cursor 3" in run.out
    run = await cli("groups", "--cursor", "3", "--json", url=redis_url)
    page = run.json()
    assert [g["group"] for g in page["groups"]] == ["g1", "g0"]
    assert page["next_cursor"] is None
    run = await cli("group", "g0", url=redis_url)
    assert run.code == 0
    assert run.out.startswith("group 'g0': at_cap")
    assert "1 running, at its concurrency of 1" in run.out
    assert "c1" in run.out  # its consumer, in the slot holders
    run = await cli("group", "g0", "--json", url=redis_url)
    info = run.json()
    want = await admin.group_info("g0")
    assert info["state"] == GroupState.AT_CAP == want.state
    assert info["holders"][0]["consumer"] == "c1"
    assert info["reason"] == want.reason
    run = await cli("groups", "--sort", "halted", url=redis_url)
    assert (run.code, run.out.strip()) == (0, "no halted groups")


async def test_task(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    ids = await producer.enqueue_many([aiogroupq.Task("imp", {"n": 1}, group="g")] * 3)
    await claim(redis_client)
    run = await cli("task", ids[2], url=redis_url)
    assert run.code == 0
    assert value(run.out, "state") == "queued"
    assert "line, 2 ahead in its group" in run.out
    assert "{'n': 1}" in run.out
    run = await cli("task", ids[0], "--json", url=redis_url)
    data = run.json()
    assert (data["state"], data["consumer"], data["position"]) == ("running", "c1", 0)
    assert data["payload"] == {"n": 1}
    run = await cli("task", "no-such-task", url=redis_url)
    assert run.code == 1
    assert "no task 'no-such-task'" in run.err


async def test_consumers(redis_url: str, redis_client: redis.asyncio.Redis) -> None:
    await _scripts.heartbeat(
        redis_client,
        KEYS,
        [],
        lease_ms=LEASE_MS,
        consumer="worker-7",
        registration=[("host", "box"), ("pid", 99), ("c", 16), ("n", 2)],
    )
    run = await cli("consumers", url=redis_url)
    assert run.code == 0
    header, row = run.out.splitlines()
    assert header.split()[:4] == ["NAME", "HOST", "PID", "STATE"]
    # In flight: what it holds on the server (nothing), not its heartbeat's 2.
    assert row.split()[:6] == ["worker-7", "box", "99", "alive", "0", "16"]
    run = await cli("consumers", "--json", url=redis_url)
    (data,) = run.json()
    assert (data["name"], data["pid"], data["alive"]) == ("worker-7", 99, True)
    assert (data["in_flight"], data["stats"]["running"]) == (0, 2)


# -- dead letters ----------------------------------------------------------------


async def test_dead_list_and_show(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    ids = await dead_letters(redis_client, producer, 3)
    run = await cli("dead", "list", "--limit", "2", url=redis_url)
    assert run.code == 0
    lines = run.out.splitlines()
    assert lines[0].split()[:3] == ["TASK", "TYPE", "GROUP"]
    listed = [line.split()[0] for line in lines[1:3]]
    assert len(set(listed)) == 2
    assert set(listed) <= set(ids)  # dead in the same ms: ordered by id then
    assert "ValueError: bad row" in lines[1]
    assert "(1 more: --limit)" in run.out
    run = await cli("dead", "list", "--json", url=redis_url)
    assert sorted(d["id"] for d in run.json()) == sorted(ids)
    run = await cli("dead", "show", ids[0], url=redis_url)
    assert run.code == 0
    assert value(run.out, "state") == "dead"
    assert "Traceback" in run.out
    assert (await cli("dead", "show", ids[0], "--json", url=redis_url)).json()[
        "error"
    ] == "ValueError: bad row"
    live = await producer.enqueue("t")
    run = await cli("dead", "show", live, url=redis_url)
    assert run.code == 1
    assert "is not dead: it is queued" in run.err


async def _sent(client: redis.asyncio.Redis) -> int:
    """Bytes the server has sent to its clients so far."""
    return int((await client.info("stats"))["total_net_output_bytes"])


async def test_dead_list_reads_no_payload_for_its_table(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    # The table shows no payload, yet every letter's payload was read whole:
    # megabytes from Redis for a table of a few lines.
    letters, blob = 6, "x" * (400 * 1024)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids = [
            await producer.enqueue("t", blob, max_attempts=1) for _ in range(letters)
        ]
    await finish(redis_client, await claim(redis_client, letters), "dead")
    before = await _sent(redis_client)
    run = await cli("dead", "list", url=redis_url)
    sent = await _sent(redis_client) - before
    assert run.code == 0, run
    assert {line.split()[0] for line in run.out.splitlines()[1:]} == set(ids)
    print(f"dead list read {sent} bytes for {letters} letters")  # noqa: T201
    assert sent < len(blob), sent  # less than one payload
    run = await cli("dead", "list", "--json", url=redis_url)
    assert [d["payload"] for d in run.json()] == [blob] * letters


async def test_dead_requeue_and_purge_all_show_progress(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await dead_letters(redis_client, producer, 1200)
    run = await cli("dead", "requeue", "--all", url=redis_url)
    assert run.code == 0
    assert "requeued 1,200 dead letters" in run.out
    assert run.err.count("requeued: 1,200/1,200") == 1  # the progress, on stderr
    stats = await admin.stats()
    assert (stats.dead, stats.ready) == (0, 1200)
    for _ in range(3):  # dead again
        await finish(redis_client, await claim(redis_client, 400), "dead")
    run = await cli("dead", "purge", "--all", url=redis_url)
    assert run.code == 0
    assert "purged 1,200 dead letters" in run.out
    assert "purged: 1,200/1,200" in run.err
    assert (await admin.stats()).dead == 0


async def test_dead_requeue_and_purge_by_id(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _admin = both
    ids = await dead_letters(redis_client, producer, 3)
    run = await cli("dead", "requeue", ids[0], url=redis_url)
    assert (run.code, run.out.strip()) == (0, "requeued 1 of 1 task")
    assert await producer.status(ids[0]) == "queued"
    run = await cli("dead", "purge", ids[1], ids[2], url=redis_url)
    assert (run.code, run.out.strip()) == (0, "purged 2 of 2 tasks")
    assert await producer.status(ids[1]) is None
    # Like rm: what could be done is done, and the rest makes the status 1.
    run = await cli("dead", "requeue", ids[0], url=redis_url)
    assert run.code == 1  # not a dead letter
    assert run.out.strip() == "requeued 0 of 1 task"
    assert f"not a dead letter: {ids[0]!r} (queued)" in run.err
    run = await cli("dead", "purge", url=redis_url)
    assert run.code == 2
    assert "give task ids or --all" in run.err


# -- acting ----------------------------------------------------------------------


async def test_release(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    await finish(redis_client, await claim(redis_client), "halt")
    assert (await admin.group_info("g")).state == GroupState.HALTED
    run = await cli("release", "g", url=redis_url)
    assert run.code == 0
    assert (await admin.group_info("g")).state == GroupState.READY
    run = await cli("release", "g", url=redis_url)
    assert run.code == 1
    assert "group 'g' is not halted" in run.err


async def test_pause_and_resume(redis_url: str, both: Both) -> None:
    producer, admin = both
    await producer.enqueue("t", group="g")
    run = await cli("pause", "g", url=redis_url)
    assert (run.code, run.out.strip()) == (0, "paused group 'g'")
    assert (await admin.group_info("g")).state == GroupState.PAUSED
    assert (await cli("resume", "g", url=redis_url)).code == 0
    assert (await admin.group_info("g")).state == GroupState.READY
    run = await cli("pause", url=redis_url)
    assert (run.code, run.out.strip()) == (0, f"paused queue {QUEUE!r}")
    assert (await admin.stats()).paused
    assert (await cli("resume", url=redis_url)).code == 0
    assert not (await admin.stats()).paused


async def test_repartition(redis_url: str, both: Both) -> None:
    producer, admin = both
    held = await producer.enqueue("t", group="g")  # nothing consumes it
    run = await cli("repartition", url=redis_url)
    assert run.code == 2
    assert "--to K" in run.err
    run = await cli("repartition", "--to", "3", url=redis_url)
    assert run.code == 1, run.err
    assert "moving to 3 partitions" in run.out
    assert "group 'g' has live tasks in partition 0" in run.out
    assert await admin.partitions() == (1, 3)
    await producer.cancel(held)
    run = await cli("repartition", "--finish", "--wait", "30", url=redis_url)
    assert run.code == 0, run.err
    assert "3 partitions, the move is finished" in run.out
    assert await admin.partitions() == (3, None)


async def test_cancel(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    running, waiting = await producer.enqueue_many([aiogroupq.Task("t", group="g")] * 2)
    await claim(redis_client)
    run = await cli("cancel", waiting, url=redis_url)
    assert (run.code, run.out.strip()) == (0, f"cancelled task {waiting!r}")
    assert await producer.status(waiting) == "cancelled"
    run = await cli("cancel", running, url=redis_url)
    assert run.code == 0
    assert "is running: its consumer cancels it" in run.out
    done = await producer.enqueue("t")
    await finish(redis_client, await claim(redis_client), "ok")
    run = await cli("cancel", done, url=redis_url)
    assert run.code == 1
    assert "had already ended (succeeded)" in run.err
    run = await cli("cancel", "no-such-task", url=redis_url)
    assert run.code == 1


async def test_requeue_into_a_full_group_says_why_it_left_some_alone(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, admin = both
    ids = [await producer.enqueue("t", group="g", max_attempts=1) for _ in range(3)]
    for _ in ids:
        await finish(redis_client, await claim(redis_client), "dead")
    await producer.enqueue("t", group="g")
    await admin.set_group("g", max_size=2)
    run = await cli("dead", "requeue", *ids, url=redis_url)
    assert run.code == 1
    assert run.out.strip() == "requeued 1 of 3 tasks"
    assert "left alone: 2 tasks" in run.err
    assert "of a group at its max_size ('g'" in run.err
    assert (await admin.group_info("g")).backlog + 1 <= 2
