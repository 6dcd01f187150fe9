"""``identity.lua`` through its wrapper: a consumer name held by one live
process at a time."""

from __future__ import annotations

import redis.asyncio

from aiogroupq._store import scripts as _scripts

from ._scripts_helpers import KEYS


async def test_identity_hold_take_renew_force_drop(
    redis_client: redis.asyncio.Redis,
) -> None:
    key = KEYS.consumer("w")

    async def run(op: str, me: str, dead: str = "") -> str:
        return await _scripts.identity(redis_client, KEYS, "w", op, me, 60_000, dead)

    assert await run("take", "A") == ""
    assert await run("take", "B") == "A"
    # A lapsed hold is taken again by its renewal, if nobody took it.
    await redis_client.delete(key)
    assert await run("renew", "A") == ""
    assert await redis_client.get(key) == b"A"
    # force replaces only the dead holder it saw.
    assert await run("force", "B", dead="Z") == "A"
    assert await run("force", "B", dead="A") == ""
    assert await run("renew", "A") == "B"
    assert await run("drop", "A") == ""
    assert await redis_client.get(key) == b"B"
    assert await run("drop", "B") == ""
    assert await redis_client.exists(key) == 0
