"""The view scripts' raw replies as Python values: numbers, text, server
times and field lists. Each reader is lenient (a missing or unusable value
gives a default, never an error), since a reply may carry what a damaged key
left behind, and a view must still show the rest.
"""

from __future__ import annotations

__all__ = ("as_int", "opt_int", "opt_text", "pairs", "secs")

import math
from collections.abc import Sequence
from typing import Any

from .._store.replies import text as _text


def opt_text(value: Any) -> str | None:
    """A reply's bytes as text, ``None`` if missing."""
    return None if value is None else _text(value)


def as_int(value: Any, default: int = 0) -> int:
    """A reply number or stored counter; *default* if missing or unusable."""
    if value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):  # "inf" as well
            return default


def opt_int(value: Any) -> int | None:
    """A number of a pipeline's replies, ``None`` if missing, an error or
    negative."""
    if value is None or isinstance(value, Exception):
        return None
    number = as_int(value, -1)
    return None if number < 0 else number


def secs(value: Any) -> float | None:
    """Server milliseconds as Unix seconds, ``None`` if missing."""
    if value is None:
        return None
    try:
        seconds = float(value) / 1000
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) else None  # "inf", "nan"


def pairs(flat: Sequence[Any]) -> dict[str, Any]:
    """A flat ``[field, value, ...]`` reply (``HGETALL``'s) as a dict."""
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}
