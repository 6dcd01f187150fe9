"""Least privilege: a producer and a consumer run as a Redis ACL user limited
to one queue's keys and the commands aiogroupq sends, and are refused another
queue's keys.

The command list is derived from the Lua scripts (every ``redis.call('X'`` /
``redis.pcall('X'``) plus the commands the Python side sends itself, so that
this test keeps up with the scripts; docs/operations.md must show the same
list ("An ACL user per queue").
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import AsyncIterator, Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis.asyncio
import redis.exceptions

import aiogroupq
from aiogroupq import TaskState
from aiogroupq._store.keys import QueueKeys

from ._scripts_helpers import dump

QUEUE = "acl"
OTHER = "acl-other"
ROOT = Path(__file__).resolve().parents[1]
#: liveness only
PATIENCE = 30.0

# Commands the Python side sends itself (not from inside a script), by the
# redis-py method that sends them. HELLO is sent by the server check (and by
# redis-py's handshake); CONFIG GET and INFO are optional: refused, they only
# cost a warning, so the rule leaves them out.
PYTHON_COMMANDS = {
    "ping": "ping",
    "fcall": "fcall",  # the functions library (_store/functions.py)
    "function_load": "function|load",  # the library, where it is missing
    "evalsha": "evalsha",  # where FCALL or FUNCTION LOAD is refused
    "script_load": "script|load",  # after NOSCRIPT (SCRIPT FLUSH, restart)
    "eval": "eval",  # the call itself after NOSCRIPT
    "zscore": "zscore",  # which of a claim's dead-lettered ids are dead (on_dead)
    "time": "time",  # a schedule's next tick, on the server's clock
    "get": "get",  # a schedule's last tick
    "set": "set",  # a new schedule's start (SET NX)
    "zrem": "zrem",  # a consumer leaving the registry
    "delete": "del",  # a consumer leaving the registry
    "blpop": "blpop",  # consumers wait on the wake list; result() on done:<id>
    "rpush": "rpush",
    "hget": "hget",  # status()
    "zrange": "zrange",  # Admin.dead_letters()
    "hmget": "hmget",  # Admin.dead_letters()
    "zrangebyscore": "zrangebyscore",  # the live consumers (partition shares)
}
HANDSHAKE = {"hello"}
OPTIONAL = {"config_get": "config|get", "info": "info"}
# Refused, TYPE only leaves the found type out of a damaged key's error.
OPTIONAL["type"] = "type"
# Admin.settings(): an operator's call, whose rule adds +hgetall.
OPERATOR_COMMANDS = {"hgetall": "hgetall"}
# Methods that send no command of their own.
NOT_COMMANDS = {"pipeline", "aclose", "execute", "execute_command", "scan_iter"}
# A cluster client's own: they read its slot map (or send CLUSTER SLOTS and
# COMMAND, which a cluster user's rule adds: docs/operations.md).
NOT_COMMANDS |= {"get_connection_kwargs", "get_node_from_key", "get_primaries"}
NOT_COMMANDS |= {"initialize", "get_nodes"}
# Modules outside what producers and consumers run (the consistency check,
# the demo and its embedded server).
OPERATOR_MODULES = {
    "_check/check.py",
    "_check/confirm.py",
    "_check/starts.py",
    "_cli/demo.py",
    "_embedded.py",
    "_check/repair.py",
    "_check/conf_rebuild.py",
    "_check/snapshot.py",
    "_cli/ops.py",
    "_inspect/aggregate.py",
    "_store/repartition.py",
    "_inspect/reads.py",  # the views: their add-on rule in docs/operations.md
    "_inspect/consumers.py",  # the views: their add-on rule in docs/operations.md
    "_inspect/estimate.py",  # Admin.estimate, a view: the same add-on rule
}
# Folders outside what producers and consumers run: the web UI (its own
# rule in docs/operations.md) and the test helpers with their servers.
NOT_LIBRARY = {"_dashboard", "testing"}
# Scripts only operators run (aiogroupq check --repair).
OPERATOR_SCRIPTS = {
    "control.lua",  # Admin's settings and pauses: the operators' rule
    "repair.lua",
    "stats.lua",
    "group_info.lua",
    "consumers.lua",
    "task_info.lua",
    "estimate.lua",
    "inspect.lua",
    "registry.lua",
}


def lua_commands() -> set[str]:
    """Every command a script calls, lower case."""
    return script_commands(
        lambda name: name.endswith(".lua") and name not in OPERATOR_SCRIPTS
    )


def script_commands(chosen: Callable[[str], bool]) -> set[str]:
    """Every command the scripts whose file names are *chosen* call, lower
    case."""
    found: set[str] = set()
    lua = files("aiogroupq").joinpath("_lua")
    for script in [*lua.iterdir(), *lua.joinpath("lib").iterdir()]:
        if not chosen(script.name):
            continue
        source = script.read_text(encoding="utf-8")
        calls = re.findall(r"redis\.p?call\(", source)
        named = re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]", source)
        # A command named by a variable would escape the list (group_info.lua
        # once sent ZREVRANGE so, and the views' rule missed it): refuse it.
        assert len(named) == len(calls), f"{script.name}: a call without a literal"
        found.update(command.lower() for command in named)
    return found


def python_methods() -> set[str]:
    """redis-py methods the package calls on a client or pipeline."""
    found: set[str] = set()
    package = ROOT / "aiogroupq"
    for module in package.rglob("*.py"):
        name = module.relative_to(package).as_posix()
        if name in OPERATOR_MODULES or name.split("/")[0] in NOT_LIBRARY:
            continue
        source = module.read_text(encoding="utf-8")
        found.update(re.findall(r"\b(?:client|pipe)\.([a-z_]+)\(", source))
    return found


def worker_commands() -> set[str]:
    """What the ACL rule of a queue's user must grant."""
    return lua_commands() | set(PYTHON_COMMANDS.values()) | HANDSHAKE


def test_every_command_the_python_side_sends_is_accounted_for() -> None:
    unknown = python_methods() - set(PYTHON_COMMANDS) - set(OPTIONAL) - NOT_COMMANDS
    unknown -= set(OPERATOR_COMMANDS)
    assert not unknown, (
        f"new redis-py calls {sorted(unknown)}: add their commands to "
        "PYTHON_COMMANDS and to the ACL rule in docs/operations.md"
    )


def test_the_documented_rule_grants_exactly_the_commands_needed() -> None:
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = docs.split("## An ACL user per queue", 1)[1].split("\n## ", 1)[0]
    rule = re.search(r"ACL SETUSER [^`]*", section)
    assert rule is not None, "no ACL SETUSER rule in the section"
    granted = set(re.findall(r"\+([a-z|@]+)", rule[0]))
    assert granted == worker_commands(), (
        f"docs grant {sorted(granted - worker_commands())} too many and "
        f"{sorted(worker_commands() - granted)} too few"
    )
    assert "~{aiogroupq:<queue>}:*" in rule[0]


def _rule(queue: str) -> list[str]:
    """``ACL SETUSER`` arguments after the name, as the docs give them."""
    return [
        "on",
        ">worker-pw",
        "resetkeys",
        f"~{{aiogroupq:{queue}}}:*",
        "resetchannels",
        "-@all",
        *sorted(f"+{command}" for command in worker_commands()),
    ]


@contextlib.asynccontextmanager
async def _user(
    redis_client: redis.asyncio.Redis, redis_url: str, rule: list[str]
) -> AsyncIterator[str]:
    """A URL logging in as a user with *rule*, the library and the scripts
    flushed first: the user loads what it calls itself."""
    user = f"aiogroupq-{QUEUE}-{os.getpid()}"
    execute: Any = redis_client.execute_command
    await execute("ACL", "SETUSER", user, *rule)
    await redis_client.script_flush()
    await redis_client.function_flush()
    try:
        yield redis_url.replace("redis://", f"redis://{user}:worker-pw@")
    finally:
        await redis_client.acl_deluser(user)


@pytest.fixture
async def worker_url(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> AsyncIterator[str]:
    """A URL logging in as a user allowed exactly what a worker of QUEUE needs."""
    async with _user(redis_client, redis_url, _rule(QUEUE)) as url:
        yield url


async def _fcalls(client: redis.asyncio.Redis) -> int:
    stats: dict[str, Any] = await client.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


@pytest.mark.library
async def test_the_documented_rule_takes_the_library(
    worker_url: str, redis_client: redis.asyncio.Redis
) -> None:
    before = await _fcalls(redis_client)
    async with aiogroupq.Producer(worker_url, queue=QUEUE) as producer:
        task_id = await producer.enqueue("plain", 1)
        assert await producer.status(task_id) is TaskState.QUEUED
    # The ping that found the library missing was refused no call: it ran.
    assert await _fcalls(redis_client) - before >= 2


async def test_a_rule_without_functions_takes_evalsha(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    # The rule of the versions before the library: its workers still work,
    # by EVALSHA (the probe's FCALL is refused, and so never counted as run).
    rule = [r for r in _rule(QUEUE) if r not in ("+fcall", "+function|load")]
    assert len(rule) == len(_rule(QUEUE)) - 2
    rows = Rows()
    before = await _fcalls(redis_client)
    async with (
        _user(redis_client, redis_url, rule) as url,
        aiogroupq.Producer(url, queue=QUEUE) as producer,
        aiogroupq.Consumer(url, queue=QUEUE, handlers=handlers_of(rows)),
    ):
        ids = [await producer.enqueue("plain", n, group="g") for n in range(3)]
        ids += await producer.enqueue_many([aiogroupq.Task("plain", 3)])
        with anyio.fail_after(PATIENCE):
            for task_id in ids:
                while await producer.status(task_id) is not TaskState.SUCCEEDED:
                    await anyio.sleep(0.01)
    assert sorted(rows.ran) == [("plain", n) for n in range(4)]
    assert await _fcalls(redis_client) == before


class Rows:
    """What the handlers saw."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int]] = []


def handlers_of(rows: Rows) -> dict[str, Any]:
    """Handlers that succeed, retry once, fail for good, and store a result."""

    async def plain(n: int) -> None:
        rows.ran.append(("plain", n))

    async def flaky(n: int) -> None:
        rows.ran.append(("flaky", n))
        if aiogroupq.current_task().attempt == 1:
            raise aiogroupq.Retry(delay=0.01)

    async def poison(n: int) -> None:
        raise ValueError(n)

    async def answer(n: int) -> int:
        return n * 2

    return {
        "plain": plain,
        "flaky": flaky,
        "poison": poison,
        "answer": aiogroupq.Handler(answer, store_result=True),
    }


async def check_as_a_read_only_user(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    """A read-only user may run the consistency check."""
    user = f"aiogroupq-check-{os.getpid()}"
    execute: Any = redis_client.execute_command
    await execute(
        "ACL", "SETUSER", user, "on", ">check-pw", "resetkeys",
        f"~{{aiogroupq:{QUEUE}}}:*", "resetchannels", "-@all",
        "+@read", "+ping", "+hello",
    )  # fmt: skip
    try:
        url = redis_url.replace("redis://", f"redis://{user}:check-pw@")
        assert await aiogroupq.check_queue(url, QUEUE) == []
    finally:
        await redis_client.acl_deluser(user)


async def test_a_producer_and_a_consumer_work_with_least_privilege(
    worker_url: str,
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = Rows()
    handlers = handlers_of(rows)
    with caplog.at_level(logging.WARNING):
        async with (
            aiogroupq.Producer(worker_url, queue=QUEUE) as producer,
            aiogroupq.Admin(worker_url, queue=QUEUE) as admin,
            aiogroupq.Consumer(
                worker_url, queue=QUEUE, handlers=handlers, lease_ttl=3.0
            ),
        ):
            ids = [await producer.enqueue("plain", n, group="g") for n in range(3)]
            ids += await producer.enqueue_many(
                [
                    aiogroupq.Task("plain", 10, delay=0.05),
                    aiogroupq.Task("plain", 11, dedup_key="once"),
                    aiogroupq.Task("plain", 11, dedup_key="once"),
                ]
            )
            flaky_id = await producer.enqueue("flaky", 1, group="f")
            dead_id = await producer.enqueue("poison", 1, max_attempts=1)
            cancelled = await producer.enqueue("plain", 99, delay=3600)
            assert await producer.cancel(cancelled) is True
            with anyio.fail_after(PATIENCE):
                assert await producer.result(await producer.enqueue("answer", 21)) == 42
                for task_id in [*ids, flaky_id]:
                    while await producer.status(task_id) is not TaskState.SUCCEEDED:
                        await anyio.sleep(0.01)
                while await producer.status(dead_id) is not TaskState.DEAD:
                    await anyio.sleep(0.01)
            letters = await admin.dead_letters()
            assert [letter.id for letter in letters] == [dead_id]
            assert await admin.requeue_dead(dead_id) == 1
            with anyio.fail_after(PATIENCE):
                while await producer.status(dead_id) is not TaskState.DEAD:
                    await anyio.sleep(0.01)
            assert await admin.purge_dead(dead_id) == 1
            assert await producer.status(cancelled) is TaskState.CANCELLED
    assert [n for kind, n in rows.ran if kind == "plain" and n < 10] == [0, 1, 2]
    assert sorted(n for kind, n in rows.ran if kind == "plain") == [0, 1, 2, 10, 11]
    assert rows.ran.count(("flaky", 1)) == 2
    # Nothing was refused along the way (a consumer logs and retries a
    # refused claim instead of failing), but the eviction check: CONFIG is
    # left out on purpose.
    refused = _refusals(caplog.records)
    assert all("maxmemory-policy" in message for message in refused), refused
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "asked to retry" not in r.getMessage()
    ]
    assert warned, "the eviction check should say it could not run"
    assert all("maxmemory-policy" in message for message in warned), warned
    await check_as_a_read_only_user(redis_client, redis_url)


def _refusals(records: list[logging.LogRecord]) -> list[str]:
    """The messages of the records that carry an ACL refusal (logged as an
    argument or with its traceback): found by the error class the reply's
    ``NOPERM`` prefix maps to, never by the server's wording, which differs
    between Redis and Valkey versions."""
    kinds = (redis.exceptions.NoPermissionError, aiogroupq.PermissionDeniedError)
    found = []
    for record in records:
        args = record.args if isinstance(record.args, tuple) else ()
        carried = [*args, record.exc_info[1] if record.exc_info else None]
        if any(isinstance(arg, kinds) for arg in carried):
            found.append(record.getMessage())
    return found


async def test_another_queue_is_refused_with_a_typed_error(
    worker_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async def h() -> None:
        pass

    # Entering reads the queue's partition layout: refused already there.
    # The message names the reply's error code (redis-py strips it), never
    # the server's wording, which differs between Redis 7.0 and Valkey.
    with pytest.raises(aiogroupq.PermissionDeniedError, match="NOPERM") as caught:
        async with aiogroupq.Producer(worker_url, queue=OTHER):
            pass
    assert isinstance(caught.value.__cause__, redis.exceptions.NoPermissionError)
    with pytest.raises(aiogroupq.PermissionDeniedError):
        async with aiogroupq.Consumer(worker_url, queue=OTHER, handlers={"h": h}):
            pass
    assert await redis_client.keys(f"{{aiogroupq:{OTHER}}}:*") == []


# -- the views' add-on rule ----------------------------------------------------

#: the views' scripts and the helpers only they include
VIEW_SCRIPTS = {
    "stats.lua",
    "group_info.lua",
    "consumers.lua",
    "task_info.lua",
    "estimate.lua",
    "inspect.lua",
    "registry.lua",
}


def view_commands() -> set[str]:
    """What the views send beyond the worker's rule: their scripts' calls,
    and ``HGETALL`` (``Admin.settings()`` and ``group_settings()``)."""
    found = {"hgetall"} | script_commands(lambda name: name in VIEW_SCRIPTS)
    return found - worker_commands()


def documented_view_rule() -> set[str]:
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = docs.split("## An ACL user per queue", 1)[1].split("\n## ", 1)[0]
    found = re.search(
        r"The views \(.*?add\s+`([^`]*)`\s+to the worker rule", section, re.DOTALL
    )
    assert found is not None, "no add-on rule for the views in the section"
    return set(re.findall(r"\+([a-z|@]+)", found[1]))


def test_the_documented_view_rule_is_what_the_views_send() -> None:
    assert documented_view_rule() == view_commands()


@pytest.fixture
async def viewer_url(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> AsyncIterator[str]:
    """A URL logging in as the worker rule plus the documented views rule."""
    user = f"aiogroupq-views-{os.getpid()}"
    execute: Any = redis_client.execute_command
    extra = sorted(f"+{c}" for c in documented_view_rule())
    await execute("ACL", "SETUSER", user, *_rule(QUEUE), *extra)
    try:
        yield redis_url.replace("redis://", f"redis://{user}:worker-pw@")
    finally:
        await redis_client.acl_deluser(user)


async def _every_view(admin: aiogroupq.Admin, task_id: str) -> list[str]:
    """Call every view of *admin*; return the names of those that ran."""
    ran = []
    assert (await admin.stats()).exists
    ran.append("stats")
    assert (await admin.group_info("g")).backlog >= 1
    ran.append("group_info")
    for sort in ("busiest", "oldest", "halted", "paused"):
        await admin.groups(sort=sort)
        ran.append(f"groups({sort})")
    assert (await admin.task(task_id)).id == task_id
    ran.append("task")
    assert await admin.position(task_id) is not None
    ran.append("position")
    await admin.consumers()
    ran.append("consumers")
    await admin.group_settings("g")
    await admin.settings()
    await admin.dead_letters()
    ran += ["group_settings", "settings", "dead_letters"]
    return ran


async def test_every_view_runs_under_the_documented_rule(
    viewer_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("t", group="g")
        task_id = await producer.enqueue("t", group="g")
    async with aiogroupq.Admin(viewer_url, queue=QUEUE) as admin:
        ran = await _every_view(admin, task_id)
    print(f"{len(ran)} views ran under the documented rule: {', '.join(ran)}")  # noqa: T201


@pytest.mark.parametrize("view", ["stats", "group_info", "groups", "task", "consumers"])
async def test_a_view_refused_inside_its_script_names_what_to_grant(
    worker_url: str, redis_client: redis.asyncio.Redis, view: str
) -> None:
    # Redis 7.0 answers a command refused inside a script with a plain ERR:
    # the views raised it as a raw redis ResponseError.
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("t", group="g")
    async with aiogroupq.Admin(worker_url, queue=QUEUE) as admin:
        call: Any = {
            "stats": admin.stats,
            "group_info": lambda: admin.group_info("g"),
            "groups": admin.groups,
            "task": lambda: admin.task(task_id),
            "consumers": admin.consumers,
        }[view]
        with pytest.raises(aiogroupq.PermissionDeniedError) as caught:
            await call()
    message = str(caught.value)
    print(message)  # noqa: T201
    assert "NOPERM" in message
    wanted = " ".join(f"+{c}" for c in sorted(view_commands() - {"hgetall"}))
    assert wanted in message


# -- the operator commands under the worker rule -------------------------------


async def test_pause_group_refused_a_command_raises_permission_denied(
    worker_url: str, viewer_url: str, redis_client: redis.asyncio.Redis
) -> None:
    # pause_group reads the group's claims with HGETALL, beyond the worker
    # rule: the refusal inside control.lua came back as a plain ERR (a raw
    # redis ResponseError, on Redis 7.0 and Valkey alike), after the pause
    # was written (scripts never roll back).
    keys = QueueKeys(QUEUE)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        await producer.enqueue("t", group="g")
    async with aiogroupq.Admin(worker_url, queue=QUEUE) as admin:
        with pytest.raises(aiogroupq.PermissionDeniedError, match="NOPERM") as caught:
            await admin.pause_group("g")
        print(caught.value)  # noqa: T201
        assert "hgetall" in str(caught.value).lower()
        assert isinstance(caught.value.__cause__, redis.exceptions.NoPermissionError)
        # Refused before any write: the group is not paused.
        assert await redis_client.hget(keys.group_conf("g"), "p") is None
        assert not await redis_client.sismember(keys.paused, "g")
        # The settings are written by control.lua alone, nothing read back
        # from here: both work under the worker rule.
        await admin.set_group("g", concurrency=2)
        await admin.update_group("g", weight=3)
    async with aiogroupq.Admin(viewer_url, queue=QUEUE) as admin:
        await admin.pause_group("g")  # +hgetall granted: it goes through
        assert await admin.group_settings("g") == aiogroupq.GroupSettings(
            concurrency=2, weight=3, paused=True
        )


# -- the repair under an operator's rule -----------------------------------------


def _repair_checks() -> set[str]:
    """The commands repair.lua asks about before any write (its
    ``BEYOND_WORKER`` list), lower case."""
    source = files("aiogroupq").joinpath("_lua", "repair.lua").read_text("utf-8")
    listed = re.search(r"local BEYOND_WORKER = \{([^}]*)\}", source)
    assert listed is not None, "repair.lua lists no BEYOND_WORKER"
    return {name.lower() for name in re.findall(r"'([A-Z]+)'", listed[1])}


def test_the_repair_asks_about_every_command_beyond_the_worker_rule() -> None:
    needed = script_commands(lambda name: name == "repair.lua") - worker_commands()
    assert _repair_checks() == needed
    docs = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    wanted = " ".join(f"+{c}" for c in sorted(needed))
    assert f"add the worker rule and `{wanted}`" in docs


async def test_a_repair_refused_a_command_writes_nothing_and_says_so(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    # An operator with the worker rule and +@read (what the check needs)
    # lacks LINSERT, which putting a lost task back in its line calls: the
    # refusal came as a plain ERR from inside repair.lua, after the step's
    # earlier writes.
    from . import _damage

    q = await _damage.build(redis_client)
    await _damage.DAMAGES["lost-in-line"][0](q)
    pattern = _damage.KEYS.pattern()
    before = await dump(redis_client, pattern)
    user = f"aiogroupq-repair-{os.getpid()}"
    execute: Any = redis_client.execute_command
    rule = _rule(_damage.QUEUE)
    await execute("ACL", "SETUSER", user, *rule, "+@read", "+multi", "+exec")
    url = redis_url.replace("redis://", f"redis://{user}:worker-pw@")
    try:
        assert await aiogroupq.check_queue(url, _damage.QUEUE)  # it may read
        with pytest.raises(aiogroupq.PermissionDeniedError, match="NOPERM") as caught:
            await aiogroupq.repair_queue(url, _damage.QUEUE)
    finally:
        await redis_client.acl_deluser(user)
    print(caught.value)  # noqa: T201
    assert "linsert" in str(caught.value)
    assert await dump(redis_client, pattern) == before  # nothing written
    assert await aiogroupq.repair_queue(redis_client, _damage.QUEUE)  # as admin
