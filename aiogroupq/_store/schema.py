"""The names of the fields the Python reads and writes in a queue's hashes
(the Lua side names them in ``_lua/lib/base.lua`` and ``lib/slots.lua``),
so that a field renamed in one place is renamed everywhere."""

from __future__ import annotations

from typing import Final

from .._limits import MAX_WEIGHT

__all__ = (
    "GROUP_SETTINGS",
    "QUEUE_SETTINGS",
    "TOTALS",
    "WEIGHT",
    "valid_weight",
)

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
#: a group's weight, in its ``gconf:<g>`` hash and the queue's ``conf``
WEIGHT: Final = "wt"
#: the fields of a group's settings hash ``gconf:<g>`` (besides its pause,
#: ``p``), in the order ``control.lua``'s "group" operation takes them:
#: concurrency, rate (starts per period, the period in ms), max size,
#: priority, weight, ordering
GROUP_SETTINGS: Final = ("c", "rn", "rp", "mx", "pr", WEIGHT, "o")
#: the settings fields of a queue's ``conf`` hash: fairness, pause, the
#: groups' default concurrency and rate, priority aging (ms), their default
#: weight
QUEUE_SETTINGS: Final = ("fair", "pause", "c", "rn", "rp", "age", WEIGHT)


def valid_weight(value: str) -> bool:
    """Whether *value* is a weight that ``Admin`` could have stored."""
    return value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_WEIGHT
