"""docs/operations.md's ACL rule, taken from the page itself: enough to run a
queue, refused on another queue, and complete for the Lua scripts."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest
import redis.asyncio
from redis.exceptions import NoPermissionError

import aiogroupq

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTED_QUEUE = "imports"
DOCUMENTED_USER = "aiogroupq-imports"
#: what aiogroupq check needs on top of the rule
CHECK_EXTRA = tuple(
    re.findall(
        r"\+[a-z|]+",
        re.findall(
            r"`aiogroupq check` \(`check_queue`\) also needs.*",
            (ROOT / "docs/operations.md").read_text(),
        )[0],
    )
)


def documented_rule() -> list[str]:
    """The ``ACL SETUSER`` block of docs/operations.md, as arguments."""
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```text\n(ACL SETUSER .*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "docs/operations.md should hold one ACL SETUSER block"
    words: list[str] = blocks[0].split()
    assert words[:3] == ["ACL", "SETUSER", DOCUMENTED_USER]
    return words[3:]


def rule_for(queue: str, password: str, extra: tuple[str, ...] = ()) -> list[str]:
    out = []
    for word in documented_rule():
        if word.startswith(">"):
            word = ">" + password
        out.append(
            word.replace(f"{{aiogroupq:{DOCUMENTED_QUEUE}}}", f"{{aiogroupq:{queue}}}")
        )
    return [*out, *extra]


def test_rule_allows_every_command_the_scripts_call() -> None:
    allowed = {word[1:].lower() for word in documented_rule() if word.startswith("+")}
    lua = "\n".join(
        path.read_text() for path in (ROOT / "aiogroupq" / "_lua").rglob("*.lua")
    )
    called = {name.lower() for name in re.findall(r"redis\.p?call\(\s*'(\w+)'", lua)}
    assert called, "no redis.call found: has the scripts' style changed?"
    assert called - allowed == set()


def _as_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def acl_user(
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Make a user from the documented rule; returns its URL. Deleted after."""
    made: list[str] = []

    async def make(queue: str, extra: tuple[str, ...] = ()) -> str:
        user, password = f"aiogroupq-test-{secrets.token_hex(4)}", secrets.token_hex(8)
        await redis_client.acl_setuser(user, reset=True)  # a known starting point
        await redis_client.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", user, *rule_for(queue, password, extra)
        )
        made.append(user)
        pool = redis_client.connection_pool.connection_kwargs
        base = f"redis://{pool['host']}:{pool['port']}/{pool.get('db', 0)}"
        return _as_user(base, user, password)

    try:
        yield make
    finally:
        for user in made:
            await redis_client.acl_deluser(user)


class Boom(Exception):
    pass


async def test_a_queue_runs_under_the_documented_rule(
    acl_user: Callable[..., Awaitable[str]],
) -> None:
    url = await acl_user("acl-q", CHECK_EXTRA)
    attempts: dict[str, int] = {}

    async def flaky(payload: dict[str, int]) -> None:
        key = str(payload["n"])
        attempts[key] = attempts.get(key, 0) + 1
        if attempts[key] == 1:
            raise aiogroupq.Retry(delay=0.01)

    async def square(n: int) -> int:
        return n * n

    async def broken(payload: object) -> None:
        raise Boom(payload)

    handlers: dict[str, aiogroupq.Handler | Callable[..., Awaitable[object]]] = {
        "flaky": flaky,
        "square": aiogroupq.Handler(square, store_result=True),
        "broken": aiogroupq.Handler(broken, on_dead="halt"),
    }
    async with (
        aiogroupq.Producer(url, queue="acl-q") as producer,
        aiogroupq.Consumer(
            url, queue="acl-q", handlers=handlers, name="acl-worker", lease_ttl=2.0
        ) as consumer,
    ):
        ids = [await producer.enqueue("flaky", {"n": n}, group="g1") for n in range(3)]
        ids += await producer.enqueue_many(
            [aiogroupq.Task("flaky", {"n": 10}, delay=0.05, dedup_key="once")]
        )
        assert await producer.enqueue("flaky", {"n": 10}, dedup_key="once") == ids[-1]
        assert (
            await producer.result(
                await producer.enqueue("square", 7), timeout=10, result_type=int
            )
            == 49
        )
        far = await producer.enqueue("flaky", {"n": 99}, delay=3600)
        assert await producer.cancel(far)
        dead = await producer.enqueue("broken", "x", group="halted", max_attempts=1)
        with pytest.raises(aiogroupq.TaskFailedError):
            await producer.result(dead, timeout=10)
        with anyio.fail_after(10):
            while consumer.stats.succeeded < len(ids) + 1:
                await anyio.sleep(0.01)
        for task_id in ids:
            assert await producer.status(task_id) is aiogroupq.TaskState.SUCCEEDED
        assert [letter.id for letter in await producer.dead_letters()] == [dead]
        assert await producer.release_group("halted")
        assert await producer.requeue_dead(dead) == 1
        with anyio.fail_after(10):
            while await producer.status(dead) is not aiogroupq.TaskState.DEAD:
                await anyio.sleep(0.01)
        assert await producer.purge_dead() == 1
    assert await aiogroupq.check_queue(url, "acl-q") == []


async def test_the_rule_keeps_a_user_to_its_queue(
    acl_user: Callable[..., Awaitable[str]],
) -> None:
    url = await acl_user("mine")
    async with aiogroupq.Producer(url, queue="theirs") as producer:
        with pytest.raises(NoPermissionError):
            await producer.enqueue("t", 1)
    async with aiogroupq.Producer(url, queue="mine") as producer:
        assert await producer.enqueue("t", 1)
