"""Sends attempt outcomes to Redis in batches: one ``finish.lua`` call per batch.

Handlers hand their outcome over without waiting; while one batch is in
flight, the next one gathers, so the batch size adapts to the load with no
added delay. A batch whose reply was lost is sent again, ahead of what came
meanwhile (a partition's outcomes apply in order): ``finish.lua`` is
idempotent per fencing token. So is a batch refused for a damaged queue key:
its outcomes stay queued until the key is repaired (see ``damage.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from .._limits import MAX_OUTCOMES_PER_CALL
from .._store import scripts as _scripts
from .._store.connection import REDIS_FAILURES
from .._store.replies import FinishCode
from ..errors import CorruptQueueError
from .damage import PROBE, DamageWatch

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from .._store.partition import Partitions

logger = logging.getLogger("aiogroupq.consumer")  # it records consumers' outcomes

Callback = Callable[[_scripts.Outcome, FinishCode], None]


class Finisher:
    """Batches outcomes; ``on_done(outcome, code)`` runs once each is applied."""

    def __init__(
        self,
        client: Client,
        parts: Partitions,
        *,
        retention_ms: int,
        on_done: Callback,
        watch: DamageWatch,
    ) -> None:
        self._client = client
        self._parts = parts
        self._retention_ms = retention_ms
        self._on_done = on_done
        self._watch = watch
        self._pending: list[_scripts.Outcome] = []
        # Plain asyncio: set once per outcome, it must cost next to nothing.
        self._wakeup = asyncio.Event()
        # run() and close() may both send; one batch at a time keeps each
        # outcome reported once.
        self._sending = asyncio.Lock()

    def submit(self, outcome: _scripts.Outcome) -> None:
        """Queue *outcome* (never blocks)."""
        self._pending.append(outcome)
        self._wakeup.set()

    async def _send_batch(self) -> bool:
        """Send the oldest pending batch, one call per partition it spans;
        False if Redis failed for a partition (its outcomes stay pending)."""
        async with self._sending:
            batch = self._pending[:MAX_OUTCOMES_PER_CALL]
            if not batch:
                return True
            if self._watch.restoring:
                # Until the leases are set again, an outcome would be refused
                # as late and its task run again.
                return False
            parts: dict[QueueKeys, list[_scripts.Outcome]] = {}
            for outcome in batch:
                parts.setdefault(self._parts.of_id(outcome.id), []).append(outcome)
            done: list[tuple[_scripts.Outcome, FinishCode]] = []
            failed: list[_scripts.Outcome] = []
            refused: set[QueueKeys] = set()

            async def send(keys: QueueKeys, outcomes: list[_scripts.Outcome]) -> None:
                who = f"finish:{keys.partition}"
                try:
                    codes = await _scripts.finish(
                        self._client, keys, outcomes, retention_ms=self._retention_ms
                    )
                except CorruptQueueError as exc:  # nothing written: kept for later
                    self._watch.refused(who, exc, leases=keys.leases)
                    refused.add(keys)
                    failed.extend(outcomes)
                    return
                except REDIS_FAILURES as exc:
                    logger.warning(
                        "could not record %d outcomes (%s)", len(outcomes), exc
                    )
                    failed.extend(outcomes)
                    return
                self._watch.succeeded(who)
                done.extend(zip(outcomes, codes, strict=True))

            # The batch stays pending until it is recorded (close() waits for
            # it); cancelled on the way, it is sent again, and a re-sent
            # outcome is recognised by its token.
            if len(parts) == 1:
                await send(*next(iter(parts.items())))
            else:
                async with anyio.create_task_group() as tg:
                    for keys, outcomes in parts.items():
                        tg.start_soon(send, keys, outcomes)
            del self._pending[: len(batch)]
            if failed:
                # Ahead of what came meanwhile: a partition's outcomes apply
                # in order (a batch's: its members lined up last first, its
                # head last). A partition refused for a damaged key goes
                # behind the others, whole and in order, so as not to fill
                # every next batch and hold them back.
                self._pending[:0] = failed
                if refused:
                    of_id = self._parts.of_id
                    self._pending.sort(key=lambda o: of_id(o.id) in refused)
        for outcome, code in done:
            self._on_done(outcome, code)
        return not failed

    async def run(self) -> None:
        """Send batches as outcomes arrive, until cancelled."""
        backoff = 0.05
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if await self._send_batch():
                backoff = 0.05
            else:
                await anyio.sleep(backoff)
                # Damage lasts until a repair: try often enough to resume soon.
                cap = PROBE if self._watch.damaged or self._watch.restoring else 2.0
                backoff = min(backoff * 2, cap)

    async def close(self, timeout: float) -> int:
        """Send what is pending within *timeout*, whether or not :meth:`run`
        is still alive (it is cancelled with its task group when the block
        around the consumer is); return how many outcomes were left."""
        with anyio.move_on_after(timeout):
            while self._pending:
                if not await self._send_batch():
                    await anyio.sleep(0.1)
        return len(self._pending)
