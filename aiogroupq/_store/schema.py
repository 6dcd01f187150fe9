"""The names of the fields the Python reads and writes in a queue's hashes
(the Lua side names them in ``_lua/lib/base.lua`` and ``lib/slots.lua``),
so that a field renamed in one place is renamed everywhere."""

from __future__ import annotations

from typing import Final

__all__ = ("TOTALS",)

#: the lifetime counters of the ``stats`` hash (``QueueStats.totals``)
TOTALS: Final = (
    "enqueued",
    "started",
    "succeeded",
    "retried",
    "dead",
    "cancelled",
    "expired",
    "recovered",
)
