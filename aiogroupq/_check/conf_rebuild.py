"""Rebuilding a queue's ``conf`` that holds another type than a hash (the
repair's ``conf`` step, ``_lua/repair.lua``), keeping what can be read.

Deleting it, as the repair does with other keys of the wrong type, would
lose the queue's settings and, for a partitioned queue, its layout: every
client would then take it for a queue of one partition. Instead the new hash
gets, field by field:

- what the damaged key still holds in a readable form: a list or a stream
  of field, value pairs (as ``HGETALL`` gives them), ``field=value``
  entries of a list, a set or a string, a zset's members scored with their
  values, a string holding a JSON object; only the fields aiogroupq writes,
  each with a value it could have written;
- else the queue's settings (``fair``, ``pause``, ``c``, ``rn``/``rp``,
  ``age``), which ``Admin`` writes to every partition alike, from another
  partition's ``conf``;
- the partition layout (``parts``): partition 0's own if readable, else the
  one the other partitions' copies give (``_store/layout.py``); another
  partition gets partition 0's.

The flags the scripts set (``pu``, ``gc``, ``uq``) are kept if readable;
the repair's next round sets any that the queue's keys call for.
"""

from __future__ import annotations

__all__ = ("conf_step", "salvage")

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from .._limits import MAX_CONCURRENCY
from .._store.partition import Layout
from .._store.schema import QUEUE_SETTINGS, WEIGHT, valid_weight
from .._store.wrongtype import is_wrong_type
from ..errors import ConfigurationError

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys
    from .snapshot import Snapshot

#: the queue's settings, the same in every partition (Admin.configure,
#: Admin.pause write them to each)
#: flags a script sets once something is in use (est: Admin.estimate's)
_FLAGS: Final = ("pu", "gc", "uq", "est")
_KNOWN: Final = frozenset({*QUEUE_SETTINGS, *_FLAGS, "parts"})
_POSITIVE: Final = re.compile(r"[1-9][0-9]{0,17}")
_SEPARATORS: Final = re.compile(r"[\s,;&]+")


def _valid(name: str, value: str) -> bool:
    """Whether *value* is one aiogroupq could have written to field *name*."""
    if name == "fair":
        return value == "drain"
    if name in ("pause", *_FLAGS):
        return value == "1"
    if name == "parts":
        try:
            return Layout.parse(value) != Layout()
        except ConfigurationError:
            return False
    if not _POSITIVE.fullmatch(value):
        return False
    if name == WEIGHT:
        return valid_weight(value)
    return name != "c" or int(value) <= MAX_CONCURRENCY


def _tokens(text: str) -> list[str]:
    """A damaged string's entries: a JSON object's fields and values, else
    its words."""
    if text.lstrip().startswith("{"):
        try:
            loaded = json.loads(text)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            return [
                f"{k}={v}"
                for k, v in loaded.items()
                if isinstance(v, str | int) and not isinstance(v, bool)
            ]
    return [t for t in _SEPARATORS.split(text) if t]


def salvage(kind: str, entries: Sequence[str]) -> dict[str, str]:
    """The fields a damaged ``conf`` of type *kind* still holds readably
    (see the module's docstring), with the values aiogroupq could have
    written; a later entry wins, as with ``HSET``."""
    items = _tokens(entries[0]) if kind == "string" and entries else list(entries)
    ordered = kind != "set"  # a set keeps no pairs: only field=value entries
    found: dict[str, str] = {}
    i = 0
    while i < len(items):
        name, sep, value = items[i].partition("=")
        if sep:
            found[name.strip()] = value.strip()
            i += 1
        elif ordered and name in _KNOWN and i + 1 < len(items):
            found[name] = items[i + 1]
            i += 2
        else:
            i += 1
    out = {k: v for k, v in found.items() if k in _KNOWN and _valid(k, v)}
    if ("rn" in out) != ("rp" in out):  # half a rate is none
        out.pop("rn", None)
        out.pop("rp", None)
    return out


async def _sibling_settings(
    client: Client, keys: QueueKeys, count: int
) -> tuple[int, dict[str, str]] | None:
    """The queue's settings as the first other partition with a readable
    ``conf`` holds them (partition 0 first): (partition, settings)."""
    for partition in range(count):
        if partition == keys.partition:
            continue
        other = type(keys)(keys.queue, partition)
        try:
            raw: Any = await client.hgetall(other.conf)
        except ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            continue  # damaged too
        fields = {
            bytes(k).decode(errors="replace"): bytes(v).decode(errors="replace")
            for k, v in raw.items()
        }
        return partition, {k: v for k, v in fields.items() if k in QUEUE_SETTINGS}
    return None


async def conf_step(
    client: Client, keys: QueueKeys, snap: Snapshot, layout: Layout
) -> tuple[str, ...]:
    """The arguments of the repair's ``conf`` step for a partition whose
    ``conf`` is damaged (``snap.damaged_conf``), *layout* being the queue's
    (read or recovered)."""
    kind, entries = snap.damaged_conf or ("none", [])
    own = salvage(kind, entries)
    fields = dict(own)
    whys = []
    if own:
        whys.append(f"kept {', '.join(sorted(own))} from what it held")
    if not any(name in own for name in QUEUE_SETTINGS):
        sibling = await _sibling_settings(client, keys, layout.count)
        if sibling is not None:
            partition, settings = sibling
            fields.update(settings)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))
            whys.append(
                f"the queue's settings ({shown or 'the defaults'}) from "
                f"partition {partition}"
            )
        else:
            whys.append(
                "no settings were readable: the queue's settings are back to "
                "their defaults (set them again with Admin.configure or "
                "Admin.pause if it had any)"
            )
    if layout != Layout() and (keys.partition or "parts" not in own):
        fields["parts"] = layout.text()
        source = "partition 0" if keys.partition else "the other partitions' copies"
        whys.append(f"layout {layout.text()} from {source}")
    pairs = [v for name in sorted(fields) for v in (name, fields[name])]
    return ("conf", kind, "; ".join(whys), *pairs)
