"""A queue's ``conf`` hash replaced by a key of another type (issue 17).

It holds the queue's settings and, for a partitioned queue, its layout.
Damaged, it used to stop every client with a raw ``redis.ResponseError``:
``aiogroupq check`` and ``check --repair`` crashed with a traceback, and only
a manual ``DEL`` helped, losing the settings. Now the check reports it (a
``wrong-type`` problem naming the key), the repair rebuilds it keeping what
is readable (from the damaged key, else the other partitions), and every
reader raises :class:`aiogroupq.CorruptQueueError` naming the key and saying
to run ``aiogroupq check --repair``; the command line answers in one line.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import CorruptQueueError
from aiogroupq._check import problems as problem_kinds
from aiogroupq._check.check import check_queue
from aiogroupq._check.repair import repair_queue
from aiogroupq._store.keys import QueueKeys
from aiogroupq.testing import drain

from .test_cli_ops import cli

QUEUE: Final = "confdmg"
#: the settings every test gives its queue before the damage
FAIRNESS: Final = "drain"
CONCURRENCY: Final = 3
WEIGHT: Final = 3

#: a damage: (client, the conf key, the hash it held) -> None
Damage = Callable[[redis.asyncio.Redis, str, dict[str, str]], Awaitable[None]]


async def _as_string(client: redis.asyncio.Redis, key: str, _: dict[str, str]) -> None:
    # Nothing readable is left: an operator's stray SET.
    await client.delete(key)
    await client.set(key, "damage")


async def _as_list(client: redis.asyncio.Redis, key: str, held: dict[str, str]) -> None:
    # A tool that copied the hash as HGETALL gives it: every field readable.
    await client.delete(key)
    await client.rpush(key, *(v for pair in sorted(held.items()) for v in pair))


async def _as_zset(client: redis.asyncio.Redis, key: str, held: dict[str, str]) -> None:
    # Numbers as scores, the rest as field=value members: readable too.
    await client.delete(key)
    members: dict[str, float] = {}
    for name, value in held.items():
        if value.isdigit():
            members[name] = float(value)
        else:
            members[f"{name}={value}"] = 0.0
    await client.zadd(key, members)


async def _as_set(client: redis.asyncio.Redis, key: str, held: dict[str, str]) -> None:
    # A set keeps no pairs: only field=value members can be read.
    await client.delete(key)
    await client.sadd(key, *(f"{name}={value}" for name, value in held.items()))


async def _as_stream(
    client: redis.asyncio.Redis, key: str, held: dict[str, str]
) -> None:
    await client.delete(key)
    fields: dict[Any, Any] = dict(held)
    await client.xadd(key, fields)


async def _as_json(client: redis.asyncio.Redis, key: str, held: dict[str, str]) -> None:
    await client.delete(key)
    await client.set(key, json.dumps(held))


#: name -> (damage, the type it leaves, whether the settings stay readable)
DAMAGES: Final[dict[str, tuple[Damage, str, bool]]] = {
    "string": (_as_string, "string", False),
    "list": (_as_list, "list", True),
    "zset": (_as_zset, "zset", True),
    "set": (_as_set, "set", True),
    "stream": (_as_stream, "stream", True),
    "json-string": (_as_json, "string", True),
}


async def _hash(client: redis.asyncio.Redis, key: str) -> dict[str, str]:
    raw: Any = await client.hgetall(key)
    return {bytes(k).decode(): bytes(v).decode() for k, v in raw.items()}


async def _queue(
    client: redis.asyncio.Redis, partitions: int | None = None
) -> tuple[list[str], dict[int, dict[str, str]]]:
    """A queue with settings and tasks in 6 groups (every partition of 3
    has some); the ids, and each partition's conf as it was."""
    async with aiogroupq.Producer(
        client, queue=QUEUE, partitions=partitions
    ) as producer:
        ids = [await producer.enqueue("t", n, group=f"g{n % 6}") for n in range(12)]
    async with aiogroupq.Admin(client, queue=QUEUE) as admin:
        await admin.configure(
            fairness=FAIRNESS, group_concurrency=CONCURRENCY, group_weight=WEIGHT
        )
    confs = {p: await _hash(client, QueueKeys(QUEUE, p).conf) for p in range(3)}
    return ids, confs


async def _settings_and_layout(
    client: redis.asyncio.Redis,
) -> tuple[aiogroupq.QueueSettings, tuple[int, int | None]]:
    async with aiogroupq.Admin(client, queue=QUEUE) as admin:
        return await admin.settings(), await admin.partitions()


async def _drained(client: redis.asyncio.Redis, ids: list[str]) -> None:
    """The repaired queue runs every task."""

    async def handler(payload: object) -> None:
        del payload

    outcomes = await drain(client, queue=QUEUE, handlers={"t": handler})
    states = {o.id: o.state for o in outcomes}
    assert states == dict.fromkeys(ids, aiogroupq.TaskState.SUCCEEDED)


def _conf_problems(problems: list[problem_kinds.Problem], key: str) -> list[str]:
    return [p.kind for p in problems if p.key == key]


# -- one partition -----------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(DAMAGES))
async def test_check_reports_a_damaged_conf_and_repair_rebuilds_it(
    redis_client: redis.asyncio.Redis, kind: str
) -> None:
    ids, confs = await _queue(redis_client)
    key = QueueKeys(QUEUE).conf
    damage, left, readable = DAMAGES[kind]
    await damage(redis_client, key, confs[0])

    problems = await check_queue(redis_client, QUEUE)
    for problem in problems:
        print(f"check: {problem}")  # noqa: T201
    assert _conf_problems(problems, key) == [problem_kinds.WRONG_TYPE]
    assert f"is a {left}, not a hash" in str(problems)

    changes = await repair_queue(redis_client, QUEUE)
    for change in changes:
        print(f"repaired: {change}")  # noqa: T201
    assert [c.step for c in changes][:1] == ["conf"]
    assert await check_queue(redis_client, QUEUE) == []
    settings, layout = await _settings_and_layout(redis_client)
    assert layout == (1, None)
    if readable:
        assert (
            settings.fairness,
            settings.group_concurrency,
            settings.group_weight,
        ) == (FAIRNESS, CONCURRENCY, WEIGHT)
        assert "kept c, fair, wt" in changes[0].detail
    else:
        assert settings == aiogroupq.QueueSettings()
        assert "back to their defaults" in changes[0].detail
    await _drained(redis_client, ids)


async def test_every_reader_raises_corrupt_queue_error(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    ids, confs = await _queue(redis_client)
    key = QueueKeys(QUEUE).conf
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
    ):
        await _as_string(redis_client, key, confs[0])
        # Opened before the damage: each call meets it.
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "Producer.enqueue": lambda: producer.enqueue("t", 0, group="g0"),
            "Admin.settings": admin.settings,
            "Admin.stats": admin.stats,
            "Admin.group_info": lambda: admin.group_info("g0"),
            "Admin.groups": admin.groups,
            "Admin.task": lambda: admin.task(ids[0]),
            "Admin.position": lambda: admin.position(ids[0]),
            "Admin.dead_letters": admin.dead_letters,
            "Admin.partitions": admin.partitions,
            "Admin.configure": admin.configure,
            "Admin.pause": admin.pause,
        }
        for name, call in calls.items():
            with pytest.raises(CorruptQueueError) as caught:
                await call()
            print(f"{name}: {caught.value}")  # noqa: T201
            assert caught.value.key == key, name
            assert "aiogroupq check --repair" in str(caught.value), name

    async def handler(payload: object) -> None:
        del payload

    # Entered after it: refused at start-up, before anything is claimed.
    for role in (
        lambda: aiogroupq.Producer(redis_url, queue=QUEUE),
        lambda: aiogroupq.Admin(redis_url, queue=QUEUE),
        lambda: aiogroupq.Producer(redis_url, queue=QUEUE, partitions=2),
        lambda: aiogroupq.Consumer(redis_url, queue=QUEUE, handlers={"t": handler}),
    ):
        with pytest.raises(CorruptQueueError) as caught:
            async with role():
                pass
        print(f"start-up: {caught.value}")  # noqa: T201
        assert caught.value.key == key
        # The layout's script cannot name the type (no TYPE in a worker's rule).
        assert "not a hash" in str(caught.value)
    assert await redis_client.type(key) == b"string"  # nobody wrote anything


# -- partitions ---------------------------------------------------------------------


@pytest.mark.parametrize("partition", [0, 2])
@pytest.mark.parametrize("kind", ["string", "zset"])
async def test_a_partitioned_queue_keeps_its_partitions(
    redis_client: redis.asyncio.Redis, partition: int, kind: str
) -> None:
    ids, confs = await _queue(redis_client, partitions=3)
    key = QueueKeys(QUEUE, partition).conf
    assert confs[partition]["parts"] == "3"
    await DAMAGES[kind][0](redis_client, key, confs[partition])

    problems = await check_queue(redis_client, QUEUE)
    for problem in problems:
        print(f"check: {problem}")  # noqa: T201
    # No layout problem on top: the damage is the one problem of that key.
    assert _conf_problems(problems, key) == [problem_kinds.WRONG_TYPE]
    if partition == 0:
        with pytest.raises(CorruptQueueError):
            await _settings_and_layout(redis_client)

    changes = await repair_queue(redis_client, QUEUE)
    for change in changes:
        print(f"repaired: {change}")  # noqa: T201
    assert await check_queue(redis_client, QUEUE) == []
    assert await _hash(redis_client, key) == confs[partition]
    settings, layout = await _settings_and_layout(redis_client)
    assert layout == (3, None)
    assert (settings.fairness, settings.group_concurrency) == (FAIRNESS, CONCURRENCY)
    await _drained(redis_client, ids)


async def test_a_repartition_under_way_is_kept(
    redis_client: redis.asyncio.Redis,
) -> None:
    _, confs = await _queue(redis_client, partitions=3)
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        await admin.start_repartition(5)
    key = QueueKeys(QUEUE).conf
    await _as_string(redis_client, key, confs[0])

    changes = await repair_queue(redis_client, QUEUE)
    for change in changes:
        print(f"repaired: {change}")  # noqa: T201
    assert await check_queue(redis_client, QUEUE) == []
    assert (await _hash(redis_client, key))["parts"] == "3>5"
    _, layout = await _settings_and_layout(redis_client)
    assert layout == (3, 5)


# -- the command line ----------------------------------------------------------------


async def test_the_command_line_answers_in_one_line(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    await _queue(redis_client, partitions=3)
    key = QueueKeys(QUEUE).conf
    await _as_string(redis_client, key, {})

    for command in (["stats"], ["groups"], ["group", "g1"]):
        run = await cli(*command, url=redis_url, queue=QUEUE)
        assert run.code == 2, run
        assert "Traceback" not in run.err
        assert run.err.count("\n") == 1, run
        assert key in run.err
        assert "aiogroupq check --repair" in run.err

    # A worker is refused at start-up: one log line says why.
    run = await cli("worker", "tests.example_app:handlers", url=redis_url, queue=QUEUE)
    assert run.code == 1, run
    assert "Traceback" not in run.err + run.out
    assert f"worker stopped: key {key!r} of the queue is damaged" in run.err

    run = await cli("check", url=redis_url, queue=QUEUE)
    assert run.code == 1, run
    assert "Traceback" not in run.err + run.out
    assert f"wrong-type: {key} is a string, not a hash" in run.out

    run = await cli("check", "--repair", url=redis_url, queue=QUEUE)
    assert run.code == 0, run
    assert f"repaired: conf: rebuilt {key} (a string)" in run.out
    assert "layout 3 from the other partitions' copies" in run.out

    run = await cli("stats", url=redis_url, queue=QUEUE)
    assert run.code == 0, run


async def test_the_dashboard_names_the_damage(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    from aiogroupq.dashboard import create_app

    from ._web import serving

    await _queue(redis_client)
    await _as_string(redis_client, QueueKeys(QUEUE).conf, {})
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for path in ("/", f"/q/{QUEUE}", f"/q/{QUEUE}/group?name=g1"):
                page = await client.get(path)
                print(path, page.status_code)  # noqa: T201
                assert page.status_code == 500, path
                assert "Damaged queue" in page.text, path


async def test_a_damaged_group_settings_key_is_a_typed_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    key = QueueKeys(QUEUE).group_conf("g0")
    async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
        await admin.set_group("g0", concurrency=2)
        await redis_client.delete(key)
        await redis_client.set(key, "c=2")
        with pytest.raises(CorruptQueueError) as caught:
            await admin.group_settings("g0")
    print(f"group_settings: {caught.value}")  # noqa: T201
    assert caught.value.key == key
    assert "aiogroupq check --repair" in str(caught.value)
