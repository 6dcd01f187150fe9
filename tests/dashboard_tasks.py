"""The handlers the dashboard's browser test runs with ``aiogroupq worker``.

- ``work``: sleeps the payload's ``sleep`` seconds; fails when the payload
  says ``fail`` (retried, then dead-lettered), like a flaky upstream.
- ``gated``: fails while the file named by the payload's ``gate`` exists: a
  task that dies now and succeeds once "the bug is fixed" (the file removed).
"""

from __future__ import annotations

from typing import Any

import anyio


async def work(payload: dict[str, Any]) -> None:
    await anyio.sleep(payload.get("sleep", 0.0))
    if payload.get("fail"):
        raise RuntimeError("upstream answered 503 Service Unavailable")


async def gated(payload: dict[str, Any]) -> None:
    if await anyio.Path(payload["gate"]).exists():
        raise RuntimeError("the billing service rejected the import (HTTP 502)")


HANDLERS = {"work": work, "gated": gated}
