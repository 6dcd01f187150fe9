"""The supervisor's trap said where an operator looks: ``aiogroupq check``
prints a warning, and a consumer logs one at start, when the server is a
primary with replicas and no AOF (``_store/restart_risk.py``). On a real
primary and its replica."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio

import aiogroupq

if TYPE_CHECKING:
    from aiogroupq.testing._server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "restart-risk"
#: liveness only
PATIENCE = 30.0
#: what the warning says, whoever says it
RISK = "has 1 replica(s) and no AOF"


async def _noop() -> None:
    pass


async def test_check_and_a_consumer_warn_of_a_primary_with_a_replica_and_no_aof(
    aiogroupq_server_factory: Callable[..., ServerProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary = aiogroupq_server_factory()  # appendonly no, as by default
    aiogroupq_server_factory(config={"replicaof": ["127.0.0.1", str(primary.port)]})
    async with redis.asyncio.Redis.from_url(primary.url) as client:
        with anyio.fail_after(PATIENCE):
            while int((await client.info("replication"))["connected_slaves"]) < 1:
                await anyio.sleep(0.05)

    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(
            [sys.executable, "-m", "aiogroupq", "check", "--queue", QUEUE,
             "--redis-url", primary.url],
            check=False,
            cwd=ROOT,
        )  # fmt: skip
    out = done.stdout.decode()
    print(out, done.stderr.decode())  # noqa: T201
    # Advisory: the check of an empty queue still exits 0.
    assert done.returncode == 0
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, out
    assert f"the primary at 127.0.0.1:{primary.port} {RISK}" in warnings[0]

    with caplog.at_level(logging.WARNING, logger="aiogroupq"):
        async with aiogroupq.Consumer(primary.url, queue=QUEUE, handlers={"t": _noop}):
            pass
    said = [r for r in caplog.records if RISK in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert said[0].levelno == logging.WARNING
