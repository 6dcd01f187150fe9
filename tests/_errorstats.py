"""How many error replies of a code a server sent (``INFO errorstats``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def error_count(errorstats: Mapping[str, Any], code: str) -> int:
    """The count of ``errorstat_<code>``: redis-py 5.0 leaves the value as
    its text (``"count=3"``), later versions parse it into a dict."""
    value = errorstats.get(f"errorstat_{code}")
    if value is None:
        return 0
    if isinstance(value, str):
        fields = dict(item.split("=", 1) for item in value.split(",") if "=" in item)
        return int(fields.get("count", 0))
    return int(value.get("count", 0))
