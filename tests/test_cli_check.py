"""``aiogroupq check`` and the errors every command shares, each run as a real
``python -m aiogroupq`` process: the queue from ``$AIOGROUPQ_QUEUE``, "did
you mean" for a misspelt queue, and a ``--redis-url`` whose port is not a
Redis server's."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq.testing._server import free_port

ROOT = Path(__file__).resolve().parents[1]


async def aiogroupq_cli(
    *args: str, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``python -m aiogroupq *args``; its status, stdout and stderr."""
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(
            [sys.executable, "-m", "aiogroupq", *args],
            check=False,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    print(f"$ aiogroupq {' '.join(args)}\n{out}{err}")  # noqa: T201
    return done.returncode, out, err


@pytest.fixture
async def http_port() -> AsyncIterator[int]:
    """The port of a tiny HTTP server: it answers whatever it is sent with
    a 400 page, as a web server does."""

    async def answer(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            await reader.read(1024)
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\n"
                b"Content-Length: 20\r\nConnection: close\r\n\r\n"
                b"<html>no redis</html>"
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [
        ["check", "--queue", "q"],
        ["stats", "--queue", "q"],
        ["dead", "list", "--queue", "q"],
        ["pause", "--queue", "q"],
        ["worker", "tests.example_app:handlers", "--queue", "q"],
    ],
)
async def test_a_port_that_is_not_redis_is_one_line_and_exit_2(
    http_port: int, command: list[str]
) -> None:
    url = f"redis://127.0.0.1:{http_port}/0"
    code, out, err = await aiogroupq_cli(*command, "--redis-url", url)
    assert code == 2, (out, err)
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"aiogroupq {' '.join(command[:1])}"), lines
    assert f"127.0.0.1:{http_port} did not answer as a Redis server" in lines[0]


async def test_the_dashboard_refuses_a_port_that_is_not_redis(http_port: int) -> None:
    # It started serving pages that could never show anything.
    pytest.importorskip("uvicorn")
    url = f"redis://127.0.0.1:{http_port}/0"
    code, out, err = await aiogroupq_cli(
        "dashboard", "--queue", "q", "--redis-url", url, "--port", str(free_port())
    )
    assert code == 2, (out, err)
    lines = (out + err).strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("aiogroupq dashboard: error: "), lines
    assert f"127.0.0.1:{http_port} did not answer as a Redis server" in lines[0]


async def test_check_reads_the_queue_from_the_environment(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    async with aiogroupq.Producer(redis_client, queue="from-env") as producer:
        await producer.enqueue("t", 1)
    code, out, _ = await aiogroupq_cli(
        "check", "--redis-url", redis_url, env={"AIOGROUPQ_QUEUE": "from-env"}
    )
    assert code == 0
    assert out.strip().splitlines()[-1] == "queue 'from-env': 0 problems"


async def test_a_misspelt_queue_gets_did_you_mean(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    for queue in ("orders", "billing", "orders-eu"):
        async with aiogroupq.Producer(redis_client, queue=queue) as producer:
            await producer.enqueue("t", 1)
    code, out, _ = await aiogroupq_cli(
        "check", "--queue", "ordrs", "--redis-url", redis_url
    )
    assert code == 0
    assert "queue 'ordrs' has no keys" in out
    assert "did you mean 'orders' or 'orders-eu'?" in out
    code, out, _ = await aiogroupq_cli(
        "check", "--queue", "zzzzzz", "--redis-url", redis_url
    )
    assert "queue 'zzzzzz' has no keys" in out
    assert "did you mean" not in out
