"""How a script runs (``_store/lua.py``): the fixed keys each script
declares are exactly the ones it reads, its header names them, a call sends
them before its own keys; and every wrapper reloads a flushed script and
runs it once, however often the cache is flushed."""

from __future__ import annotations

import re
from importlib.resources import files
from typing import cast

import pytest
import redis.asyncio

from aiogroupq._store import scripts as _scripts
from aiogroupq._store.lua import Script
from aiogroupq._store.replies import CancelCode, FinishCode

from ._scripts_helpers import (
    KEYS,
    LONG_MS,
    WINDOW_MS,
    Flush,
    Recorder,
    assert_consistent,
    claim,
    claim_one,
    control,
    enqueue,
    finish,
    new,
    ok,
)

# A header line naming a key: "KEYS[3]  {aiogroupq:<q>}:leases  ZSET ..."
_HEADER_KEY = re.compile(r"^  KEYS\[(\d+)\]\s+\{aiogroupq:<q>\}:(\w+)", re.MULTILINE)


def _lua_files() -> set[str]:
    folder = files("aiogroupq").joinpath("_lua")
    return {p.name[:-4] for p in folder.iterdir() if p.name.endswith(".lua")}


# -- the keys each script takes ------------------------------------------------


def test_every_lua_file_is_in_the_catalogue() -> None:
    assert {s.name for s in _scripts.ALL_SCRIPTS} == _lua_files()
    assert len(_scripts.ALL_SCRIPTS) == len(_lua_files())


@pytest.mark.parametrize("script", _scripts.ALL_SCRIPTS, ids=lambda s: s.name)
def test_each_header_names_the_keys_its_script_declares(script: Script) -> None:
    body = files("aiogroupq").joinpath("_lua", f"{script.name}.lua").read_text()
    header = body[: body.index("]]")]
    named = [(int(i), name) for i, name in _HEADER_KEY.findall(header)]
    declared = list(enumerate(script.key_names, start=1))
    assert named[: len(declared)] == declared
    # the call's own keys follow, numbered on
    assert [i for i, _ in named] == list(range(1, len(named) + 1))


@pytest.mark.parametrize(
    ("name", "keys"),
    [
        ("heartbeat", ()),  # reads leases
        ("wait", ("ready",)),  # reads no fixed key
        ("enqueue", ("ready", "delayed", "wake", "fence")),  # never reads fence
        ("meta", ("conf",)),  # built from the prefix, not a fixed key
        ("heartbeat", ("leases", "leases")),
    ],
)
def test_a_script_must_declare_exactly_the_fixed_keys_it_reads(
    name: str, keys: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError, match=name):
        Script(name, keys=keys)


async def test_a_call_sends_the_declared_keys_then_its_own() -> None:
    recorder = Recorder([-1, 0, 0, [], [], []])
    client = cast("redis.asyncio.Redis", recorder)
    await _scripts.claim(client, KEYS, "c1", k=1, lease_ms=LONG_MS, scan_limit=10)
    numkeys, *rest = recorder.args
    assert rest[:numkeys] == [
        KEYS.ready,
        KEYS.delayed,
        KEYS.leases,
        KEYS.wake,
        KEYS.fence,
        KEYS.dead,
        KEYS.inflight("c1"),
        KEYS.last_claim("c1"),
    ]
    assert rest[numkeys] == KEYS.prefix  # ARGV[1] of every script
    recorder.reply = []
    await _scripts.wait_done(client, KEYS, "t1", 0, 1)
    assert recorder.args[:3] == (1, KEYS.task("t1"), KEYS.prefix)


# -- a flushed cache: NOSCRIPT, or the library gone ------------------------------


async def test_every_wrapper_reloads_after_a_flush(
    redis_client: redis.asyncio.Redis, flush: Flush
) -> None:
    await flush(redis_client)
    assert await enqueue(redis_client, new("a", "g"), new("b", "g")) == ["a", "b"]
    await flush(redis_client)
    a = await claim_one(redis_client)
    await flush(redis_client)
    assert await _scripts.heartbeat(
        redis_client, KEYS, [(a.id, a.token)], lease_ms=LONG_MS
    ) == [1]
    await flush(redis_client)
    assert await finish(redis_client, ok(a)) == [FinishCode.APPLIED]
    # The other scripts' wrappers go through the same reload-and-retry.
    await enqueue(redis_client, new("c"))
    await flush(redis_client)
    assert (
        await _scripts.cancel(redis_client, KEYS, "c", retention_ms=WINDOW_MS)
        == CancelCode.CANCELLED
    )
    b = await claim_one(redis_client, "w2")
    assert b.id == "b"
    await flush(redis_client)
    assert await _scripts.recover(redis_client, KEYS, "w2", counted=False) == (1, ())
    b = await claim_one(redis_client, "w2")
    await finish(redis_client, _scripts.Outcome("b", b.token, "dead", "why"))
    await flush(redis_client)
    assert await _scripts.dead_action(redis_client, KEYS, "requeue", ["b"]) == 1
    await flush(redis_client)
    assert await control(redis_client, "pause", "g") == 0
    await flush(redis_client)
    assert await _scripts.wait_done(redis_client, KEYS, "b", 0, 1) == (
        "queued",
        None,
        "",
    )
    await flush(redis_client)
    assert await _scripts.identity(redis_client, KEYS, "w", "take", "A", 1000) == ""
    await control(redis_client, "resume", "g")
    assert (await claim_one(redis_client)).id == "b"
    await assert_consistent(redis_client)


async def test_claim_and_finish_survive_repeated_flushes(
    redis_client: redis.asyncio.Redis, flush: Flush
) -> None:
    # A flush before every call: each call reloads once and applies once, and
    # every task succeeds exactly once.
    ids = [f"t{i}" for i in range(6)]
    await enqueue(redis_client, *(new(i, "g" if int(i[1:]) % 2 else None) for i in ids))
    done: list[str] = []
    for _ in range(len(ids)):
        if len(done) == len(ids):
            break
        await flush(redis_client)
        reply = await claim(redis_client, k=2)
        await flush(redis_client)
        assert await finish(redis_client, *(ok(t) for t in reply.tasks)) == [1] * len(
            reply.tasks
        )
        done += [t.id for t in reply.tasks]
    assert sorted(done) == ids
    await assert_consistent(redis_client)
