"""Sends attempt outcomes to Redis in batches: one ``finish.lua`` call per batch.

Handlers hand their outcome over without waiting; while one batch is in
flight, the next one gathers, so the batch size adapts to the load with no
added delay. A batch whose reply was lost is sent again: ``finish.lua`` is
idempotent per fencing token.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio
from redis.exceptions import RedisError

from . import _scripts

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from ._keys import QueueKeys

logger = logging.getLogger(__name__)

MAX_BATCH: Final = 256

Callback = Callable[[_scripts.Outcome, int], None]


class Finisher:
    """Batches outcomes; ``on_done(outcome, code)`` runs once each is applied."""

    def __init__(
        self,
        client: Redis,
        keys: QueueKeys,
        *,
        retention_ms: int,
        on_done: Callback,
    ) -> None:
        self._client = client
        self._keys = keys
        self._retention_ms = retention_ms
        self._on_done = on_done
        self._pending: list[_scripts.Outcome] = []
        self._wakeup = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._closing = False

    def submit(self, outcome: _scripts.Outcome) -> None:
        """Queue *outcome* (never blocks)."""
        self._pending.append(outcome)
        if self._idle.is_set():
            self._idle = anyio.Event()
        self._wakeup.set()

    async def run(self) -> None:
        """Send batches until :meth:`close` and nothing is left."""
        backoff = 0.05
        while True:
            if not self._pending:
                self._idle.set()
                if self._closing:
                    return
                await self._wakeup.wait()
                self._wakeup = anyio.Event()
                continue
            batch = self._pending[:MAX_BATCH]
            try:
                codes = await _scripts.finish(
                    self._client, self._keys, batch, retention_ms=self._retention_ms
                )
            except (RedisError, OSError) as exc:
                logger.warning(
                    "could not record %d outcomes (%s); retrying in %.2fs",
                    len(batch),
                    exc,
                    backoff,
                )
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            del self._pending[: len(batch)]
            for outcome, code in zip(batch, codes, strict=True):
                self._on_done(outcome, code)

    async def close(self, timeout: float) -> int:
        """Flush what is pending within *timeout*; return how many were left."""
        self._closing = True
        self._wakeup.set()
        with anyio.move_on_after(timeout):
            await self._idle.wait()
        return len(self._pending)
