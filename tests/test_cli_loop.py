"""``aiogroupq worker --loop``: uvloop where installed (``auto``), asyncio's
own loop on request, and a usage error when uvloop is asked for but missing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis.asyncio

import aiogroupq

from . import example_app
from ._spawn import Proc, poll

pytest.importorskip("uvloop")
QUEUE = "cli-loop"


async def _consumed_by(
    client: redis.asyncio.Redis, redis_url: str, proc_log: Path, *loop: str
) -> str:
    """Run a worker with *loop* options over 20 tasks; its output."""
    async with aiogroupq.Producer(client, queue=QUEUE) as producer:
        ids = await producer.enqueue_many(
            aiogroupq.Task("work", example_app.Item(i, 0), group=f"g{i % 3}")
            for i in range(20)
        )
    args = ["worker", "tests.example_app:handlers", "--queue", QUEUE]
    proc = Proc([*args, "--redis-url", redis_url, *loop], proc_log)
    try:

        async def done() -> bool:
            async with aiogroupq.Producer(client, queue=QUEUE) as producer:
                states = await producer.status_many(ids)
            return set(states) == {aiogroupq.TaskState.SUCCEEDED}

        await poll(done, proc)
        await poll(lambda: "worker ready" in proc.output, proc)
        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0, proc.output
    finally:
        proc.kill()
    return proc.output


@pytest.mark.parametrize(
    ("options", "loop"),
    [
        pytest.param((), "uvloop", id="auto"),
        pytest.param(("--loop", "uvloop"), "uvloop", id="uvloop"),
        pytest.param(("--loop", "asyncio"), "asyncio", id="asyncio"),
    ],
)
async def test_the_worker_runs_on_the_loop_asked_for(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    tmp_path: Path,
    options: tuple[str, ...],
    loop: str,
) -> None:
    output = await _consumed_by(redis_client, redis_url, tmp_path / "w.log", *options)
    assert f"(event loop: {loop})" in output, output


def _without_uvloop(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import uvloop`` fails."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "uvloop.py").write_text("raise ImportError('no uvloop here')\n")
    path = os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


async def test_uvloop_asked_for_but_missing_is_a_usage_error(
    redis_url: str, tmp_path: Path
) -> None:
    args = ["worker", "tests.example_app:handlers", "--queue", QUEUE]
    args += ["--redis-url", redis_url, "--loop", "uvloop"]
    proc = Proc(args, tmp_path / "w.log", env=_without_uvloop(tmp_path))
    assert await proc.wait() == 2, proc.output
    assert "uvloop is not installed" in proc.output
    assert "Traceback" not in proc.output


async def test_auto_without_uvloop_runs_on_asyncio(
    redis_client: redis.asyncio.Redis, redis_url: str, tmp_path: Path
) -> None:
    env = _without_uvloop(tmp_path)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue("work", example_app.Item(0, 0))
    args = ["worker", "tests.example_app:handlers", "--queue", QUEUE]
    proc = Proc([*args, "--redis-url", redis_url], tmp_path / "w.log", env=env)
    try:

        async def done() -> bool:
            async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
                return await producer.status(task_id) is aiogroupq.TaskState.SUCCEEDED

        await poll(done, proc)
        await poll(lambda: "worker ready" in proc.output, proc)
        assert "(event loop: asyncio)" in proc.output, proc.output
        proc.signal(signal.SIGTERM)
        assert await proc.wait() == 0, proc.output
    finally:
        proc.kill()
