"""What the views say of the partitions each consumer serves: the consumer
registry's ``parts`` field, registered with each heartbeat, read by
``Admin.consumers()``, ``aiogroupq consumers --json`` and the dashboard's
consumers page."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import anyio
import httpx
import redis.asyncio

import aiogroupq
from aiogroupq import Producer
from aiogroupq._store.assignment import assign
from aiogroupq._store.keys import QueueKeys
from aiogroupq.dashboard import create_app
from tests._web import serving

QUEUE = "views-shares"


async def _ok(payload: object) -> None:
    pass


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


async def test_each_consumer_shows_the_partitions_it_serves(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    names = ["view-a", "view-b", "view-c"]
    want = {n: tuple(sorted(s)) for n, s in assign(6, names, 2).items()}
    async with Producer(redis_client, queue=QUEUE, partitions=6):
        pass
    consumers = [
        aiogroupq.Consumer(
            redis_client, queue=QUEUE, handlers={"w": _ok}, lease_ttl=1.5, name=n
        )
        for n in names
    ]
    with serving(create_app(redis_url, queues=[QUEUE])) as url:
        async with (
            aiogroupq.Admin(redis_client, queue=QUEUE) as admin,
            consumers[0],
            consumers[1],
            consumers[2],
            httpx.AsyncClient(base_url=url, timeout=30) as browser,
        ):
            with anyio.fail_after(30):
                while {c.name: c.partitions for c in await admin.consumers()} != want:
                    await anyio.sleep(0.05)
            page = _text((await browser.get(f"/q/{QUEUE}/consumers")).text)
            argv = [sys.executable, "-m", "aiogroupq", "consumers", "--json"]
            argv += ["--queue", QUEUE, "--redis-url", redis_url]
            listed = await anyio.to_thread.run_sync(
                lambda: (
                    subprocess.run(
                        argv, capture_output=True, text=True, timeout=60, check=True
                    ).stdout
                )
            )
    for name, share in want.items():
        assert f"{name} " in page
        assert ",".join(map(str, share)) in page
    shown = {c["name"]: tuple(c["partitions"]) for c in json.loads(listed)}
    assert shown == want


async def test_a_share_the_registry_cannot_read_shows_as_unknown(
    redis_client: redis.asyncio.Redis,
) -> None:
    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, handlers={"w": _ok}, lease_ttl=300, name="odd"
    ):
        keys = QueueKeys(QUEUE)
        with anyio.fail_after(30):
            while await redis_client.hget(keys.consumer_info("odd"), "parts") is None:
                await anyio.sleep(0.05)
        await redis_client.hset(keys.consumer_info("odd"), "parts", "x-1")
        async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
            (info,) = await admin.consumers()
    assert info.partitions is None
