"""An explicit consumer name is held by one live process at a time.

Two live consumers sharing a name would give back each other's tasks at start
(the restart path), letting a group run twice at once. The name is a key
renewed with the heartbeats; a process restarted on the same host takes it
over at once when the previous holder's pid is gone, else it waits for the
hold to lapse.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from typing import TYPE_CHECKING

import anyio

from .._store import scripts as _scripts
from .._store.registry import pid_running
from ..errors import AiogroupqError, ConfigurationError, ConsumerRunningError

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys

logger = logging.getLogger("aiogroupq.consumer")


class NameTakenError(ConsumerRunningError, ConfigurationError):
    """Another live consumer holds the name: a :class:`ConsumerRunningError`
    (a consumer of that name is running), as the changelog says, and still
    the :class:`ConfigurationError` it was first (the fix is the name).

    :ivar name: the consumer name
    """

    def __init__(self, name: str) -> None:
        AiogroupqError.__init__(
            self,
            f"another live consumer is named {name!r}: two consumers must "
            "never share a name (leave name=None for a unique one)",
        )
        self.name = name


class Identity:
    """Our hold on an explicit consumer name."""

    def __init__(self, keys: QueueKeys, name: str, ttl: float) -> None:
        self._keys = keys
        self._name = name
        self._ttl_ms = max(1000, round(ttl * 1000))
        self._me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    async def acquire(self, client: Client) -> None:
        """Hold the name, waiting at most one hold's length for another holder.

        :raises NameTakenError: (a ConsumerRunningError and a
            ConfigurationError) if a live process keeps holding it
        """
        with anyio.move_on_after(self._ttl_ms / 1000 * 1.5):
            while holder := await self._run(client, "take"):
                if _dead_here(holder) and not await self._run(client, "force", holder):
                    logger.info(
                        "consumer name %r taken over from dead process %s",
                        self._name,
                        holder,
                    )
                    return
                logger.warning(
                    "consumer name %r is held by %s; waiting for it to lapse",
                    self._name,
                    holder,
                )
                await anyio.sleep(self._ttl_ms / 10_000)
            return
        raise NameTakenError(self._name)

    async def renew(self, client: Client) -> None:
        """Extend the hold (called with every heartbeat)."""
        if holder := await self._run(client, "renew"):
            logger.warning(
                "consumer name %r passed to %s while we were silent",
                self._name,
                holder,
            )

    async def release(self, client: Client) -> None:
        """Let the name go."""
        await self._run(client, "drop")

    async def _run(self, client: Client, op: str, dead_holder: str = "") -> str:
        return await _scripts.identity(
            client, self._keys, self._name, op, self._me, self._ttl_ms, dead_holder
        )


def _dead_here(holder: str) -> bool:
    """True if *holder* (``host:pid:token``) ran on this host and its
    process is gone."""
    host_pid = holder.rpartition(":")[0]
    host, _, pid = host_pid.rpartition(":")
    return pid.isdigit() and pid_running(host, int(pid)) is False
