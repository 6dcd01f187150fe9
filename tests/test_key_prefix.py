"""A script's KEYS and its prefix (``ARGV[1]``) must be one queue's: every
script is called here as the package calls it on queue ``qb``, then the same
call is sent raw with its KEYS those of queue ``qa`` and its ARGV left as
they were. The script refuses it (``aiogroupq foreign-keys``) before doing
anything: neither queue changes by a byte. Through :class:`Script`, the
refusal is a :class:`~aiogroupq.ConfigurationError`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

import aiogroupq
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.lua import FIXED_KEYS, FOREIGN_KEYS, Script, library

from ._scripts_helpers import dump

QA, QB = QueueKeys("qa"), QueueKeys("qb")
LONG_MS = 600_000
_WAYS = ("EVALSHA", "FCALL")


@dataclass
class Call:
    """One script call as the package made it."""

    script: Script
    prefix: str
    keys: list[str]
    args: list[Any]


def _recording(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Record every script call (direct, pipelined or replicated)."""
    calls: list[Call] = []
    real_call, real_command = Script.__call__, Script.command

    async def call(self: Script, client: Any, keys: Any, extra: Any, args: Any) -> Any:
        calls.append(Call(self, keys.prefix, self.all_keys(keys, extra), list(args)))
        return await real_call(self, client, keys, extra, args)

    def command(self: Script, keys: Any, extra: Any, args: Any, **how: Any) -> Any:
        calls.append(Call(self, keys.prefix, self.all_keys(keys, extra), list(args)))
        return real_command(self, keys, extra, args, **how)

    monkeypatch.setattr(Script, "__call__", call)
    monkeypatch.setattr(Script, "command", command)
    return calls


async def _every_script(client: redis.asyncio.Redis) -> None:
    """Call each script of the package once, on queue qb, as it calls them."""
    async with (
        aiogroupq.Producer(client, queue="qb") as producer,
        aiogroupq.Admin(client, queue="qb") as admin,
    ):
        ids = [await producer.enqueue("t", group="g") for _ in range(3)]
        late = await producer.enqueue("t", delay=3600)
        await producer.enqueue("t")  # a lone plain task: enqueue_one.lua
        await producer.status_many(ids)
        await _scripts.wait_done(client, QB, ids[0], 0, 1)
        await producer.cancel(late)
        reply = await _scripts.claim(
            client, QB, "c1", k=1, lease_ms=LONG_MS, scan_limit=10
        )
        (first,) = reply.tasks
        await _scripts.heartbeat(
            client, QB, [(first.id, first.token)], lease_ms=LONG_MS
        )
        await _scripts.batch_extend(
            client, QB, "c1", first, "t", most=1, lease_ms=LONG_MS
        )
        outcome = _scripts.Outcome(first.id, first.token, "dead", "why", "tb")
        await _scripts.finish(client, QB, [outcome], retention_ms=LONG_MS)
        await admin.requeue_dead(first.id)
        await _scripts.recover(client, QB, "c1", counted=False)
        await _scripts.identity(client, QB, "w", "take", "A", 1000)
        await admin.set_group("g", concurrency=2)
        await admin.stats()
        await admin.group_info("g")
        await admin.task(ids[1])
        await admin.estimate(ids[2])
        await admin.consumers()
        await _scripts.meta(client, QB, "cas", "1", "1")
        await admin.cancel_group("g")
    # A damaged key, for a repair step.
    await client.set(QB.task("broken"), "x")
    await aiogroupq.repair_queue(client, "qb")


async def _serialized(client: redis.asyncio.Redis) -> dict[bytes | str, Any]:
    """Every key of the database, serialized (``DUMP``): to put it back."""
    return {key: await client.dump(key) for key in await client.keys("*")}


def _foreign(keys: list[str]) -> list[str]:
    return [k.replace(QB.prefix, QA.prefix, 1) for k in keys]


def _foreign_after_the_first(keys: list[str]) -> list[str]:
    return keys[:1] + _foreign(keys[1:])


@pytest.mark.parametrize(
    "mix",
    [
        pytest.param(_foreign, id="every-key"),
        pytest.param(_foreign_after_the_first, id="every-key-but-the-first"),
    ],
)
async def test_every_script_refuses_keys_of_another_queue_than_its_prefix(
    redis_client: redis.asyncio.Redis,
    monkeypatch: pytest.MonkeyPatch,
    mix: Callable[[list[str]], list[str]],
) -> None:
    calls = _recording(monkeypatch)
    await _every_script(redis_client)
    monkeypatch.undo()
    first: dict[str, Call] = {}
    for c in calls:
        if c.prefix == QB.prefix and c.keys:
            first.setdefault(c.script.name, c)
    assert set(first) == {s.name for s in _scripts.ALL_SCRIPTS}, (
        f"not called: {sorted({s.name for s in _scripts.ALL_SCRIPTS} - set(first))}"
    )
    for s in _scripts.ALL_SCRIPTS:
        await redis_client.script_load(s.source)
    await redis_client.function_load(library().source.decode(), replace=True)
    refused, wrote = [], []
    for name, c in sorted(first.items()):
        before, saved = await dump(redis_client), await _serialized(redis_client)
        keys = mix(c.keys)
        if keys == c.keys:
            # a single key: nothing after the first
            refused += [f"{name} by {way}" for way in _WAYS]
            continue
        # Both ways: the script, and its function in the library.
        execute: Any = redis_client.execute_command
        commands = (
            ["EVALSHA", c.script.sha, len(keys), *keys, c.prefix, *c.args],
            library().fcall(c.script.name, keys, (c.prefix, *c.args)),
        )
        for way, command in zip(_WAYS, commands, strict=True):
            try:
                await execute(*command)
            except redis.exceptions.ResponseError as exc:
                if str(exc).startswith(FOREIGN_KEYS):
                    refused.append(f"{name} by {way}")
        if await dump(redis_client) != before:
            wrote.append(name)
            await redis_client.flushdb()  # the next script starts clean again
            for key, dumped in saved.items():
                await redis_client.restore(key, 0, dumped)
    print(  # noqa: T201
        f"of {len(first)} scripts called with qa's KEYS and qb's prefix: "
        f"{len(refused)} refused, {len(wrote)} wrote ({', '.join(wrote) or 'none'})"
    )
    assert wrote == []
    assert refused == [f"{name} by {way}" for name in sorted(first) for way in _WAYS]


async def test_through_a_script_the_refusal_is_a_configuration_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    class Mixed:
        """qa's fixed keys with qb's prefix."""

        prefix = QB.prefix

    for name in FIXED_KEYS:
        setattr(Mixed, name, getattr(QA, name))
    with pytest.raises(aiogroupq.ConfigurationError, match="foreign-keys"):
        await _scripts.STATS(redis_client, Mixed(), (), ())  # type: ignore[arg-type]
    with pytest.raises(aiogroupq.ConfigurationError, match="foreign-keys"):
        await _scripts.WAIT(redis_client, QB, (QA.task("x"),), ())
    assert await redis_client.dbsize() == 0
