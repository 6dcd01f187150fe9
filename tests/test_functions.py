"""The functions library (``_store/functions.py``): made from the scripts,
loaded where missing, each call starting with none of the last call's
state, and a failed call sent again only when the library was gone."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio
from redis.exceptions import ResponseError

import aiogroupq
from aiogroupq._store import functions as _functions, scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.lua import library

from ._errorstats import error_count
from ._scripts_helpers import WINDOW_MS, new

if TYPE_CHECKING:
    from aiogroupq.testing._server import ServerProcess

pytestmark = pytest.mark.library

QA, QB = QueueKeys("fa"), QueueKeys("fb")


def _fresh(client: redis.asyncio.Redis) -> redis.asyncio.Redis:
    """A client on *client*'s connections whose way is not known yet."""
    return redis.asyncio.Redis(connection_pool=client.connection_pool)


# Top-level locals of _lua/lib that no call changes. A new one must be
# either marked "--- @per-call" (a call sets or changes it: the library
# resets it before each call) or added here.
CONSTANTS = {
    "RATE_WAKE",
    "WAKE_CAP",
    "LEVEL_SPAN",
    "MAX_WEIGHT",
    "MIN_RETENTION",
    "HOLDER_DETAIL",
    "REASON_CHARS",
    "DUE_SCAN",
    "CONSUMER_FIELDS",
    # functions assigned once, when a lib is loaded
    "flush_groups",
    "flush_seq",
}
PER_CALL = {
    "PREFIX",
    "K_CONF",
    "K_STATS",
    "K_STARTS",
    "K_PREADY",
    "K_PSEQ",
    "K_BACKLOG",
    "K_HALTED",
    "K_PAUSED",
    "K_WAITING",
    "NOW",
    "NOW_UP",
    "CONF",
    "COUNTS",
    "SEQ",
    "GROUPS",
    "DEFER_DROPS",
    "MOVED",
}


def _declared() -> tuple[set[str], set[str]]:
    """The top-level non-function locals of _lua/lib: (marked per-call, others)."""
    marked: set[str] = set()
    others: set[str] = set()
    for lib in files("aiogroupq").joinpath("_lua", "lib").iterdir():
        per_call = False
        for line in lib.read_text(encoding="utf-8").splitlines():
            if line == "--- @per-call":
                per_call = True
                continue
            match = re.match(r"local (?!function\b)([\w, ]+?)(?: =|\s*--|$)", line)
            if match is None:
                per_call = False
                continue
            names = {n.strip() for n in match.group(1).split(",")}
            (marked if per_call else others).update(names)
    return marked, others


def test_every_lib_state_is_reset_per_call_or_constant() -> None:
    marked, others = _declared()
    assert marked == PER_CALL
    assert others == CONSTANTS, (
        f"new top-level locals in _lua/lib: {sorted(others - CONSTANTS)}: mark "
        "them --- @per-call if a call changes them, else list them in CONSTANTS"
    )


def _listing(reply: Any) -> dict[str, Any]:
    """A FUNCTION LIST entry as a dict of text keys (redis-py makes it a dict
    of bytes, or leaves it a flat list of name, value, ..., by version)."""
    if not isinstance(reply, dict):
        reply = dict(zip(reply[0::2], reply[1::2], strict=True))
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in reply.items()}


async def test_the_library_has_each_script_with_its_flags(
    redis_client: redis.asyncio.Redis,
) -> None:
    await redis_client.function_flush()
    run: Any = redis_client.execute_command
    assert await _functions.way(_fresh(redis_client), library())  # loads it
    name = library().name
    (listed,) = await run("FUNCTION", "LIST", "LIBRARYNAME", name)
    functions = {}
    for entry in _listing(listed)["functions"]:
        fields = _listing(entry)
        flags = {f.decode() if isinstance(f, bytes) else f for f in fields["flags"]}
        functions[fields["name"].decode()] = flags
    expected = {f"{name}_ping": {"no-writes", "allow-oom"}}
    for script in _scripts.ALL_SCRIPTS:
        first = script.source.decode().partition("\n")[0]
        shebang = re.search(r"flags=(\S+)", first)
        expected[f"{name}_{script.name}"] = (
            set(shebang[1].split(",")) if shebang else set()
        )
    assert functions == expected


async def test_another_version_of_the_library_is_left_alone(
    redis_client: redis.asyncio.Redis,
) -> None:
    await redis_client.function_flush()
    other = "aiogroupq_0000000000000000"
    await redis_client.function_load(
        f"#!lua name={other}\n"
        f"redis.register_function('{other}_ping', function() return 2 end)"
    )
    assert await _functions.way(_fresh(redis_client), library())
    names = {
        _listing(lib)["library_name"].decode()
        for lib in await redis_client.function_list()
    }
    assert names == {other, library().name}


async def test_a_call_starts_with_none_of_the_last_calls_state(
    redis_client: redis.asyncio.Redis,
) -> None:
    # Two queues' calls one after the other in one pipeline: fa's enqueue
    # reads its group "g" (busy) and its priorities; fb's must see neither
    # (its own "g" is free, it has no priorities): a task of fb parked or
    # pushed to pready would be fa's state left over.
    await redis_client.function_flush()
    await _functions.way(redis_client, library())
    for keys in (QA, QB):
        await redis_client.delete(keys.ready, keys.pready, keys.parked("g"))
    await _scripts.enqueue(
        redis_client, QA, [new("a1", "g")], dedup_window_ms=WINDOW_MS
    )
    await _scripts.enqueue(
        redis_client, QA, [new("p", priority=4)], dedup_window_ms=WINDOW_MS
    )
    calls = [
        (QA, new("a2", "g", priority=2)),
        (QB, new("b1", "g")),
        (QA, new("a3", "g")),
        (QB, new("b2")),
    ]
    async with redis_client.pipeline(transaction=False) as pipe:
        for keys, task in calls:
            args = _scripts._enqueue_args([task], WINDOW_MS, None)
            pipe.execute_command(*_scripts.ENQUEUE.command(keys, (), args, fcall=True))
        replies = await pipe.execute()
    assert [r[0] for r in replies] == [b"a2", b"b1", b"a3", b"b2"]
    assert await redis_client.lrange(QB.ready, 0, -1) == [b"b1", b"b2"]
    assert await redis_client.exists(QB.pready, QB.parked("g")) == 0
    assert await redis_client.lrange(QA.parked("g"), 0, -1) == [b"a2", b"a3"]
    # The clock too: each call reads its own.
    assert await redis_client.hget(QB.task("b1"), "dt") is not None


async def test_a_failed_call_is_sent_again_only_when_its_function_was_missing(
    redis_client: redis.asyncio.Redis,
) -> None:
    run: Any = redis_client.execute_command
    client = _fresh(redis_client)
    lib = library()
    assert await _functions.way(client, lib)
    # The function was there: its error stands, and nothing is loaded.
    assert not await _functions.recover(client, ResponseError("odd"), lib, "stats")
    await redis_client.function_flush()
    # Ours or typed: never a missing function, the server not even asked.
    ours = ResponseError("aiogroupq corrupt")
    assert not await _functions.recover(client, ours, lib, "stats")
    assert not await _functions.recover(client, ResponseError("odd"), lib, "stats")
    assert not await _functions.present(client, lib)
    # The server's own answer for the missing function: loaded again.
    with pytest.raises(ResponseError) as missing:
        await run(*lib.fcall("stats", [], ()))
    # Another client loading it since does not change the answer.
    await redis_client.function_load(lib.source.decode())
    assert await _functions.recover(client, missing.value, lib, "stats")
    assert await _functions.present(client, lib)
    assert _functions.known_way(client) is True


async def test_a_replica_refusing_the_load_takes_evalsha_at_once(
    redis_client: redis.asyncio.Redis,
    aiogroupq_server_factory: Callable[..., ServerProcess],
) -> None:
    # READONLY is an answer here, not a failover to wait out: the client's
    # retry policy sends it again for its whole budget (5 s) otherwise.
    primary = aiogroupq_server_factory()
    replica = aiogroupq_server_factory()
    node = redis.asyncio.Redis.from_url(replica.url)
    try:
        await node.replicaof("127.0.0.1", primary.port)
        with anyio.fail_after(30):  # liveness only
            while (await node.info("replication")).get("master_link_status") != "up":
                await anyio.sleep(0.02)
        async with aiogroupq.Producer(primary.url, queue="fa") as producer:
            task_id = await producer.enqueue("t", group="g")
        # Gone on the replica too (as after a restart without persistence).
        async with redis.asyncio.Redis.from_url(primary.url) as first:
            await first.function_flush()
        with anyio.fail_after(30):  # liveness only
            while await node.function_list():
                await anyio.sleep(0.02)
        refused = error_count(await node.info("errorstats"), "READONLY")
        async with aiogroupq.Admin(replica.url, queue="fa") as admin:
            with anyio.fail_after(30):  # liveness only
                info = await admin.task(task_id)
            assert info is not None
            # One refusal, taken as the answer: not sent again and again.
            readonly = error_count(await node.info("errorstats"), "READONLY")
            assert readonly - refused == 1
            assert _functions.known_way(admin._open_client()) is False
    finally:
        await node.replicaof("NO", "ONE")
        await node.aclose()
