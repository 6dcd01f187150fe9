"""A group's and a queue's settings: the public types (:class:`Rate`,
:class:`GroupSettings`, :class:`QueueSettings`), the checks of each
setting, and how ``control.lua`` takes and stores them (the ``gconf:<g>``
and ``conf`` hash fields), read back the same way.
"""

from __future__ import annotations

__all__ = (
    "KEEP",
    "STORED_AS",
    "Fairness",
    "GroupSettings",
    "Ordering",
    "QueueSettings",
    "Rate",
    "check_int",
    "group_fields",
    "group_name",
    "group_settings_of",
    "int_or_none",
    "queue_args",
    "queue_settings_of",
    "rate_args",
    "read_rate",
    "update_args",
)

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Final, Literal

from .._limits import MAX_CONCURRENCY, MAX_PRIORITY, MAX_WEIGHT
from ..errors import ConfigurationError, InvalidGroupError
from . import validate as _validate
from .schema import WEIGHT

Fairness = Literal["round_robin", "drain"]
Ordering = Literal["strict", "exclusive"]


@dataclass(frozen=True, slots=True)
class Rate:
    """At most *limit* task starts of a group in any window of *period*
    seconds (a sliding window on the Redis server's clock).

    :param limit: starts per window, >= 1
    :param period: the window, in seconds (or a timedelta), at least 1 ms
    :raises ConfigurationError: for a limit or period out of range
    """

    limit: int
    period: float | timedelta

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int):
            raise ConfigurationError(f"Rate limit must be an int, got {self.limit!r}")
        if self.limit < 1:
            raise ConfigurationError(
                f"Rate limit must be >= 1 (pass rate=False for none), got {self.limit}"
            )
        _validate.setting_seconds("Rate period", self.period, minimum=0.001)

    @property
    def period_ms(self) -> int:
        """The window in whole milliseconds (rounded up)."""
        period = self.period
        seconds = period.total_seconds() if isinstance(period, timedelta) else period
        return math.ceil(seconds * 1000)


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """A group's own settings (``None``: the queue's default applies).

    :ivar concurrency: tasks of the group that may run at once
    :ivar rate: its rate limit; ``False``: none, whatever the queue's default
    :ivar max_size: most live (queued, delayed or running) tasks it may hold
    :ivar priority: priority of its tasks that are enqueued without one
    :ivar paused: whether it starts nothing new
    :ivar weight: its share of starts under backlog, relative to other
        groups' weights
    :ivar ordering: ``"exclusive"``: a task waiting out a retry's backoff
        lets later tasks of the group run meanwhile; ``None``: strict
    """

    concurrency: int | None = None
    rate: Rate | Literal[False] | None = None
    max_size: int | None = None
    priority: int | None = None
    paused: bool = False
    weight: int | None = None
    ordering: Ordering | None = None


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's settings.

    :ivar fairness: ``"round_robin"``: a group whose task ends waits behind
        every group already waiting before its next task runs; ``"drain"``:
        its next task runs first (finishes one group's backlog before others)
    :ivar group_concurrency: the concurrency of groups without their own
    :ivar group_rate: the rate limit of groups without their own, or None
    :ivar priority_aging: seconds per priority level after which a waiting
        task counts as one level higher (None: strict priorities)
    :ivar paused: whether the whole queue starts nothing new
    :ivar group_weight: the weight of groups without their own
    """

    fairness: Fairness = "round_robin"
    group_concurrency: int = 1
    group_rate: Rate | None = None
    priority_aging: float | None = None
    paused: bool = False
    group_weight: int = 1


#: an :meth:`Admin.update_group` setting left as it is
KEEP: Final = "keep"
#: the fields of ``gconf:<g>`` each group setting is stored in (control.lua)
STORED_AS: Final[dict[str, tuple[str, ...]]] = {
    "concurrency": ("c",),
    "rate": ("rn", "rp"),
    "max_size": ("mx",),
    "priority": ("pr",),
    "weight": (WEIGHT,),
    "ordering": ("o",),
}


def group_fields(
    *,
    concurrency: int | None = None,
    rate: Rate | Literal[False] | None = None,
    max_size: int | None = None,
    priority: int | None = None,
    weight: int | None = None,
    ordering: Ordering | None = None,
) -> dict[str, int | str]:
    """The checked settings as control.lua stores them, field by field in
    the order its "group" operation takes them ("": the queue's default).

    :raises ConfigurationError: for a bad setting
    """
    if concurrency is not None:
        check_int("concurrency", concurrency, 1, MAX_CONCURRENCY)
    if max_size is not None:
        check_int("max_size", max_size, 1, 2**53)
    if priority is not None:
        check_int("priority", priority, 0, MAX_PRIORITY)
    if weight is not None:
        check_int("weight", weight, 1, MAX_WEIGHT)
    if ordering not in (None, "strict", "exclusive"):
        raise ConfigurationError(
            f"ordering must be 'strict' or 'exclusive', got {ordering!r}"
        )
    rn, rp = rate_args(rate, allow_false=True)
    return {
        "c": "" if concurrency is None else concurrency,
        "rn": rn,
        "rp": rp,
        "mx": "" if max_size is None else max_size,
        "pr": "" if priority is None else priority,
        WEIGHT: "" if weight is None else weight,
        "o": "exclusive" if ordering == "exclusive" else "",
    }


def check_int(name: str, value: object, low: int, high: int) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
    ):
        raise ConfigurationError(
            f"{name} must be an int from {low} to {high}, got {value!r}"
        )


def rate_args(
    rate: Rate | Literal[False] | None, *, allow_false: bool
) -> tuple[int | str, int | str]:
    if rate is None:
        return "", ""
    if rate is False and allow_false:
        return 0, 1  # rn 0: no limit
    if not isinstance(rate, Rate):
        raise ConfigurationError(
            f"rate must be an aiogroupq.Rate{', False' if allow_false else ''} "
            f"or None, got {rate!r}"
        )
    return rate.limit, rate.period_ms


def read_rate(rn: str, rp: str | None) -> Rate | None:
    limit, period = int_or_none(rn), int_or_none(rp)
    if not limit or not period:
        return None
    return Rate(limit, period / 1000)


def int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def group_settings_of(fields: dict[str, str]) -> GroupSettings:
    """A group's own settings from its ``gconf:<g>`` hash's fields."""
    rate: Rate | Literal[False] | None = None
    if "rn" in fields:
        rate = read_rate(fields["rn"], fields.get("rp")) or False
    return GroupSettings(
        concurrency=int_or_none(fields.get("c")),
        rate=rate,
        max_size=int_or_none(fields.get("mx")),
        priority=int_or_none(fields.get("pr")),
        paused=fields.get("p") == "1",
        weight=int_or_none(fields.get(WEIGHT)),
        ordering="exclusive" if fields.get("o") == "exclusive" else None,
    )


def update_args(
    *,
    concurrency: int | Literal["keep"] | None,
    rate: Rate | Literal[False, "keep"] | None,
    max_size: int | Literal["keep"] | None,
    priority: int | Literal["keep"] | None,
    weight: int | Literal["keep"] | None,
    ordering: Ordering | Literal["keep"] | None,
) -> list[int | str]:
    """``control.lua`` "update"'s arguments: field, value pairs of the
    settings given (not :data:`KEEP`), checked.

    :raises ConfigurationError: for a bad setting, or none given
    """
    given = {
        param: value
        for param, value in (
            ("concurrency", concurrency),
            ("rate", rate),
            ("max_size", max_size),
            ("priority", priority),
            ("weight", weight),
            ("ordering", ordering),
        )
        if not (isinstance(value, str) and value == KEEP)
    }
    if not given:
        raise ConfigurationError(
            "update_group got no setting to change: name at least one "
            "(None puts it back to the queue's default)"
        )
    fields = group_fields(**given)  # type: ignore[arg-type]
    return [
        item
        for param in given
        for field in STORED_AS[param]
        for item in (field, fields[field])
    ]


def queue_args(
    *,
    fairness: Fairness,
    group_concurrency: int,
    group_rate: Rate | None,
    priority_aging: float | timedelta | None,
    group_weight: int,
) -> list[int | str]:
    """``control.lua`` "queue"'s arguments, checked ("": the default).

    :raises ConfigurationError: for a bad setting
    """
    if fairness not in ("round_robin", "drain"):
        raise ConfigurationError(
            f"fairness must be 'round_robin' or 'drain', got {fairness!r}"
        )
    check_int("group_concurrency", group_concurrency, 1, MAX_CONCURRENCY)
    check_int("group_weight", group_weight, 1, MAX_WEIGHT)
    rn, rp = rate_args(group_rate, allow_false=False)
    aging: int | str = (
        ""
        if priority_aging is None
        else _validate.to_ms(
            _validate.setting_seconds("priority_aging", priority_aging, minimum=0.001)
        )
    )
    return [
        "drain" if fairness == "drain" else "",
        "" if group_concurrency == 1 else group_concurrency,
        rn,
        rp,
        aging,
        "" if group_weight == 1 else group_weight,
    ]


def queue_settings_of(fields: dict[str, str]) -> QueueSettings:
    """A queue's settings from its ``conf`` hash's fields."""
    aging = int_or_none(fields.get("age"))
    group_rate = None
    if "rn" in fields:
        group_rate = read_rate(fields["rn"], fields.get("rp"))
    return QueueSettings(
        fairness="drain" if fields.get("fair") == "drain" else "round_robin",
        group_concurrency=int_or_none(fields.get("c")) or 1,
        group_rate=group_rate,
        priority_aging=None if aging is None else aging / 1000,
        paused=fields.get("pause") == "1",
        group_weight=int_or_none(fields.get(WEIGHT)) or 1,
    )


def group_name(group: object) -> str:
    """*group* checked as a group's name.

    :raises InvalidGroupError: for a bad name, or None
    """
    name = _validate.group(group)
    if name is None:
        raise InvalidGroupError(group, "is None; name a group")
    return name
