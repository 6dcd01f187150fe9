"""Checks a task's parameters before any I/O; each failure is a typed error."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta
from typing import Final, Literal

from .._limits import MAX_DELAY, MAX_PRIORITY, REPLICA_WAIT_MS
from ..errors import ConfigurationError, InvalidGroupError, InvalidTaskError
from .scripts import Replication

#: longest group key, task type and dedup key, in UTF-8 bytes
MAX_NAME_BYTES: Final = 256


def name(field: str, value: object) -> str:
    """A task type or dedup key: a non-empty string of at most 256 bytes."""
    if not isinstance(value, str):
        raise InvalidTaskError(field, f"expected a str, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidTaskError(field, f"{value[:40]!r} is not valid UTF-8") from None
    if size == 0 or size > MAX_NAME_BYTES:
        raise InvalidTaskError(
            field, f"{value[:40]!r} must be 1 to {MAX_NAME_BYTES} bytes of UTF-8"
        )
    return value


def group(value: object) -> str | None:
    """A group key: None, or a non-empty string of at most 256 bytes."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidGroupError(value, f"is a {type(value).__name__}, not a str")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidGroupError(value, "is not valid UTF-8") from None
    if size == 0:
        raise InvalidGroupError(value, "is empty; pass group=None for no group")
    if size > MAX_NAME_BYTES:
        raise InvalidGroupError(
            value[:40] + "...", f"is {size} bytes; the limit is {MAX_NAME_BYTES}"
        )
    return value


def seconds(field: str, value: object, *, allow_zero: bool) -> float | None:
    """A duration given as seconds (int/float) or a timedelta; None passes."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskError(
            field,
            f"expected seconds (float) or a timedelta, got {type(value).__name__}",
        )
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidTaskError(field, f"{value!r} must be finite and {bound} seconds")
    return value


def delay(value: object) -> float | None:
    """A task's delay: seconds or a timedelta from 0 to :data:`MAX_DELAY`
    (365 days); None passes."""
    checked = seconds("delay", value, allow_zero=True)
    if checked is not None and checked > MAX_DELAY:
        raise InvalidTaskError("delay", _too_late(f"{checked!r} seconds is"))
    return checked


def _too_late(what: str) -> str:
    return (
        f"{what} further off than the longest delay allowed, {MAX_DELAY:.0f} "
        "seconds (365 days) from now"
    )


DedupScope = Literal["group", "queue"]
"""Where a ``dedup_key`` holds: among the tasks of the task's group (a task
without a group: the queue's), or across the whole queue."""

_DEDUP_SCOPES: Final = ("group", "queue")


def dedup_scope(value: object) -> DedupScope | None:
    """A task's ``dedup_scope``: None (the producer's), "group" or "queue"."""
    if value is None or value in _DEDUP_SCOPES:
        return value
    raise InvalidTaskError(
        "dedup_scope", f"must be 'group' or 'queue' (or None), got {value!r:.60}"
    )


def setting_dedup_scope(value: object) -> DedupScope:
    """A producer's ``dedup_scope``: "group" or "queue"."""
    if value in _DEDUP_SCOPES:
        return value
    raise ConfigurationError(
        f"dedup_scope must be 'group' or 'queue', got {value!r:.60}"
    )


def max_attempts(value: object) -> int | None:
    """None (the default), or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidTaskError("max_attempts", f"{value!r} must be an int >= 1")
    return value


def priority(value: object) -> int | None:
    """None (the group's default, else 0), or an int from 0 to 9."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTaskError(
            "priority", f"expected an int, got {type(value).__name__}"
        )
    if not 0 <= value <= MAX_PRIORITY:
        raise InvalidTaskError(
            "priority", f"{value!r} must be from 0 to {MAX_PRIORITY} (higher first)"
        )
    return value


def expires(value: object) -> tuple[int, int]:
    """Seconds, a timedelta or an aware datetime within which a task must
    start, as (relative ms, absolute Unix ms); (0, 0) for None."""
    if value is None:
        return 0, 0
    if isinstance(value, datetime):
        return 0, future_ms("expires", value)
    relative = seconds("expires", value, allow_zero=False)
    assert relative is not None
    return to_ms(relative), 0


def to_ms(value: float) -> int:
    """Seconds to whole milliseconds, rounded up so nothing runs early."""
    return math.ceil(value * 1000)


def run_at(value: object, delay: float | None) -> int:
    """An aware datetime, not in the past and not with a delay, as Unix ms
    (0 for None). The past is judged by this machine's clock; the due time
    itself is compared with the Redis server's."""
    if value is None:
        return 0
    if delay is not None and isinstance(value, datetime):
        raise InvalidTaskError("run_at", "give either delay or run_at, not both")
    due = future_ms("run_at", value)
    assert isinstance(value, datetime)  # future_ms refuses anything else
    if due > time.time() * 1000 + MAX_DELAY * 1000:
        raise InvalidTaskError("run_at", _too_late(f"{value.isoformat()} is"))
    return due


def future_ms(field: str, value: object) -> int:
    """An aware datetime not in the past (this machine's clock), as Unix ms."""
    if not isinstance(value, datetime):
        raise InvalidTaskError(
            field, f"expected a datetime, got {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidTaskError(
            field,
            f"{value!r} has no timezone: pass an aware datetime "
            "(e.g. datetime.now(timezone.utc) + timedelta(minutes=5))",
        )
    now = datetime.now(value.tzinfo)
    if value < now:
        raise InvalidTaskError(
            field, f"{value.isoformat()} is in the past (now {now.isoformat()})"
        )
    return math.ceil(value.timestamp() * 1000)


class _InvalidTaskId(InvalidTaskError, TypeError):
    # An InvalidTaskError, and still the TypeError it was before it was one.
    pass


def task_id(value: object) -> str:
    """A task id as enqueue returns it (any non-empty str of valid UTF-8 is
    looked up).

    :raises InvalidTaskError: (also a ``TypeError``) for anything else
    """
    if not isinstance(value, str) or not value:
        raise _InvalidTaskId(
            "task_id", f"task ids are non-empty str, got {value!r:.60}"
        )
    if not value.isascii():  # ids are hex; an odd one must still encode
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _InvalidTaskId(
                "task_id", f"{value[:40]!r} is not valid UTF-8"
            ) from None
    return value


def setting_seconds(name: str, value: object, *, minimum: float = 0.0) -> float:
    """A constructor's duration: seconds or a timedelta, >= *minimum*."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not minimum <= value < 10**9
    ):
        raise ConfigurationError(
            f"{name} must be a number of seconds >= {minimum}, got {value!r}"
        )
    return float(value)


def setting_int(name: str, value: object, *, minimum: int = 1) -> int:
    """A constructor's count: an int >= *minimum* (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


Durability = Literal["primary", "replicated"]
"""``"primary"``: a write is acknowledged once the primary made it;
``"replicated"``: once a replica acknowledged it too (``WAIT 1``)."""


def durability(value: object) -> Replication | None:
    """What ``durability=`` asks for: None, or the replication to wait for."""
    if value == "primary":
        return None
    if value == "replicated":
        return Replication(1, REPLICA_WAIT_MS)
    raise ConfigurationError(
        f"durability must be 'primary' or 'replicated', got {value!r}"
    )
