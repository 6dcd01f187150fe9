"""What the consistency check reads: one queue's keys as a :class:`Snapshot`.

:func:`read` walks a queue's keys (``SCAN`` of its prefix, ``TYPE`` of each,
then what the rules need) with plain pipelines, not one atomic snapshot (a
queue may be far too large for a single ``MULTI``). Long lists and sets are
read in slices of :data:`SLICE` entries, so that no single command holds the
server for long; the cost is O(keys + entries) time and memory. It records
facts only; ``_check/check.py`` judges them.
"""

from __future__ import annotations

__all__ = (
    "FAMILIES",
    "FIXED",
    "RATE_WAKE",
    "SLICE",
    "GroupState",
    "Snapshot",
    "Task",
    "read",
)

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from redis.crc import key_slot
from redis.exceptions import ResponseError

from .._limits import DEFAULT_MAX_PAYLOAD_BYTES, ENVELOPE_OVERHEAD
from .._store.codec import (
    describe_decode_error,
    out_of_range,
    unpack,
)
from .._store.connection import node_of
from .._store.wrongtype import is_wrong_type

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys

_LIVE: Final = frozenset({"queued", "delayed", "running"})
_TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled", "expired"})
_KNOWN_STATES: Final = _LIVE | _TERMINAL

# Fixed keys by their name after the prefix, with their type.
FIXED: Final = {
    "ready": "list",
    "delayed": "zset",
    "leases": "zset",
    "wake": "list",
    "fence": "string",
    "dead": "zset",
    "conf": "hash",
    "stats": "hash",
    "starts": "hash",
    "pready": "zset",
    "pseq": "string",
    "backlog": "zset",
    "waiting": "zset",
    "halted": "set",
    "paused": "set",
    "consumers": "zset",
}
# Per-task / per-group / per-consumer keys by the word before the first ":"
# (every method of QueueKeys), with their type.
FAMILIES: Final = {
    "t": "hash",
    "grp": "hash",
    "park": "list",
    "held": "list",
    "gconf": "hash",
    "rate": "list",
    "inflight": "set",
    "consumer": "string",
    "cinfo": "hash",
    "lastclaim": "string",
    "dedup": "string",
    "done": "list",
    "sched": "string",
}
#: a "~<group>" member of the delayed ZSET: a rate-limited group's wake-up
RATE_WAKE: Final = "~"
#: entries per LRANGE / ZRANGE / SSCAN step
SLICE: Final = 10_000
#: commands per pipeline round trip
_CHUNK: Final = 1000
#: envelope bytes fetched per pipeline round trip (at least one envelope)
_ENVELOPE_BYTES: Final = 8 * 1024 * 1024
# Fields read from a task hash, in this order.
_FIELDS: Final = ("s", "g", "a", "m", "k", "c", "ft", "dt", "p", "u")
# Families whose keys are read whole; the others are checked for their type.
_READ: Final = frozenset(
    {"ready", "delayed", "leases", "dead", "pready", "backlog", "waiting"}
    | {"halted", "paused", "park", "held", "inflight"}
    | {"fence", "conf", "stats", "gconf", "grp"}
)


@dataclass(slots=True)
class Task:
    """The fields of one task hash that the check needs."""

    id: str
    state: str | None
    group: str | None
    attempt: str | None
    max_attempts: str | None
    token: str | None
    consumer: str | None
    ended: str | None
    due: str | None
    priority: str | None
    unique: str | None
    envelope_size: int  # 0: no envelope field


@dataclass(slots=True)
class GroupState:
    """A group's hash: counts, slot marks and halt marker."""

    k: str | None = None
    d: str | None = None
    w: str | None = None
    halted: str | None = None
    marks: dict[str, str] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)  # fields no script writes


@dataclass(slots=True)
class Snapshot:
    """Everything the check read, decoded to str."""

    keys: QueueKeys
    tasks: dict[str, Task] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    pready: list[str] = field(default_factory=list)
    delayed: list[str] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    fence: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    stats: dict[str, str] = field(default_factory=dict)
    backlog: dict[str, float] = field(default_factory=dict)
    waiting: set[str] = field(default_factory=set)
    halted: set[str] = field(default_factory=set)
    paused: set[str] = field(default_factory=set)
    groups: dict[str, GroupState] = field(default_factory=dict)
    gconf: dict[str, dict[str, str]] = field(default_factory=dict)
    parks: dict[str, list[str]] = field(default_factory=dict)
    held: dict[str, list[str]] = field(default_factory=dict)
    inflight: dict[str, list[str]] = field(default_factory=dict)
    #: (key, its type) of every key whose type is wrong
    wrong_types: list[tuple[str, str]] = field(default_factory=list)
    #: a conf of the wrong type: its type and what it holds, as text (a
    #: string's value; a list's, set's or stream's entries; a zset's
    #: members and scores), for the repair to salvage settings from
    damaged_conf: tuple[str, list[str]] | None = None
    unknown: list[str] = field(default_factory=list)
    #: keys of the queue in another cluster slot than its fixed keys
    outside_slot: list[str] = field(default_factory=list)
    #: live tasks whose envelope a consumer would refuse: id -> (too large,
    #: why); not too large means it does not decode or is out of range
    bad_envelopes: dict[str, tuple[bool, str]] = field(default_factory=dict)
    #: True if the queue has no key at all
    empty: bool = True
    #: fields of the estimates' start counter (``starts``), 0 if none: read
    #: by its length alone (``HLEN``), whatever it holds
    starts_fields: int = 0

    def settings(self, group: str) -> dict[str, str]:
        """The group's own settings, as the scripts see them: only once the
        queue's conf says some group has settings (``gc``)."""
        if self.conf.get("gc") != "1":
            return {}
        return self.gconf.get(group, {})

    def limit(self, group: str) -> int:
        """The group's concurrency (its own, else the queue's default, else 1)."""
        for value in (self.settings(group).get("c"), self.conf.get("c")):
            if _is_int(value):
                return int(value or 0)
        return 1

    def is_paused(self, group: str) -> bool:
        """Whether the group is paused."""
        return self.settings(group).get("p") == "1"

    def rate_wakes(self) -> set[str]:
        """Groups with a rate wake-up ``~<g>`` pending in the delayed set."""
        return {m[len(RATE_WAKE) :] for m in self.delayed if m.startswith(RATE_WAKE)}


def _text(value: object) -> str:
    # surrogateescape keeps any byte string round-trippable and comparable.
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _opt(value: object) -> str | None:
    return None if value is None else _text(value)


def _raw(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


async def _run(
    client: Client, calls: Sequence[tuple[str, tuple[Any, ...]]]
) -> list[Any]:
    """Run ``(command, args)`` pairs in pipelined chunks; errors come back as
    exception objects in place of their reply, not raised."""
    out: list[Any] = []
    for start in range(0, len(calls), _CHUNK):
        async with client.pipeline(transaction=False) as pipe:
            for command, args in calls[start : start + _CHUNK]:
                pipe.execute_command(command, *args)
            out += await pipe.execute(raise_on_error=False)
    return out


async def _read_all(client: Client, key: str, kind: str) -> list[Any] | None:
    """Every element of a list, set or zset (zset: member, score pairs), in
    slices; ``None`` if the key holds another type."""
    raw = _raw(key)
    out: list[Any] = []
    try:
        if kind == "set":
            return [member async for member in client.sscan_iter(raw, count=SLICE)]
        start = 0
        while True:
            if kind == "list":
                part: Any = await client.lrange(raw, start, start + SLICE - 1)
            else:
                part = await client.zrange(
                    raw, start, start + SLICE - 1, withscores=True
                )
            out += part
            if len(part) < SLICE:
                return out
            start += SLICE
    except ResponseError as exc:
        if is_wrong_type(exc):
            return None
        raise


#: entries read from a damaged conf (a healthy one has about a dozen fields)
_SALVAGE: Final = 1000


async def _salvage(client: Client, key: str, kind: str) -> list[str]:
    """What a key of the wrong type still holds, as text, in the order its
    type keeps (at most :data:`_SALVAGE` entries; nothing for a type no
    settings can be read from)."""
    raw = _raw(key)
    client_: Any = client  # XRANGE and the type-generic calls are untyped
    try:
        if kind == "string":
            value = await client_.getrange(raw, 0, 64 * 1024)
            return [_text(value)]
        if kind == "list":
            values = await client_.lrange(raw, 0, _SALVAGE - 1)
        elif kind == "set":
            values = (await client_.sscan(raw, 0, count=_SALVAGE))[1]
        elif kind == "zset":
            pairs = await client_.zrange(raw, 0, _SALVAGE - 1, withscores=True)
            values = [v for member, score in pairs for v in (member, _number(score))]
        elif kind == "stream":
            entries = await client_.xrange(raw, count=_SALVAGE)
            values = [
                v for _, fields in entries for pair in fields.items() for v in pair
            ]
        else:
            return []
    except ResponseError as exc:
        if is_wrong_type(exc):  # changed type since: the next check sees it
            return []
        raise
    return [_text(v) for v in values]


def _number(score: float) -> str:
    """A zset score as a setting's text: ``3`` rather than ``3.0``."""
    return str(int(score)) if score.is_integer() else repr(score)


async def _types(client: Client, names: Sequence[str]) -> list[str]:
    replies = await _run(client, [("TYPE", (_raw(name),)) for name in names])
    for reply in replies:
        if isinstance(reply, Exception):  # e.g. NOPERM: no snapshot to judge
            raise reply
    return [_text(r) for r in replies]


def _classify(keys: QueueKeys, name: str) -> tuple[str, str, str] | None:
    """(family or fixed name, item, expected type) of a key of the queue, or
    None for a key no script makes."""
    rest = name.removeprefix(keys.prefix)
    if rest in FIXED:
        return rest, "", FIXED[rest]
    family, sep, item = rest.partition(":")
    if not sep or not item or family not in FAMILIES:
        return None
    return family, item, FAMILIES[family]


async def read(
    client: Client, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Snapshot:
    """Read every key of a queue into a :class:`Snapshot` (no judgement yet,
    only the facts reading finds: keys outside the slot, unknown keys, wrong
    types, envelopes a consumer would refuse)."""
    snap = Snapshot(keys)
    slot = key_slot(_raw(keys.ready))
    names = sorted(
        {
            _text(raw)
            async for raw in client.scan_iter(
                match=keys.pattern(), count=1000, **node_of(client, keys.ready)
            )
        }
    )
    snap.empty = not names
    classified: list[tuple[str, str, str, str]] = []  # family, item, key, type
    for name in names:
        if key_slot(_raw(name)) != slot:
            snap.outside_slot.append(name)
        found = _classify(keys, name)
        if found is None:
            snap.unknown.append(name)
            continue
        classified.append((found[0], found[1], name, found[2]))
    actual = await _types(client, [c[2] for c in classified])
    usable: list[tuple[str, str, str]] = []
    for (family, item, name, expected), kind in zip(classified, actual, strict=True):
        if kind == "none":  # gone since the scan
            continue
        if kind != expected:
            snap.wrong_types.append((name, kind))
            if name == keys.conf:
                snap.damaged_conf = (kind, await _salvage(client, name, kind))
            continue
        usable.append((family, item, name))

    tasks: list[str] = []
    small: list[tuple[str, str, str]] = []  # hashes and strings: one command each
    for family, item, name in usable:
        kind = FIXED.get(family) or FAMILIES[family]
        if family == "t":
            tasks.append(item)
        elif family not in _READ:
            continue  # wake, rate, done, dedup, ...: only their type matters
        elif kind in ("hash", "string"):
            small.append((family, item, name))
        else:
            values = await _read_all(client, name, kind)
            if values is None:
                snap.wrong_types.append((name, "changed"))
                continue
            _store_collection(snap, family, item, values)
    calls: list[tuple[str, tuple[Any, ...]]] = []
    for family, _, name in small:
        kind = FIXED.get(family) or FAMILIES[family]
        calls.append(("HGETALL" if kind == "hash" else "GET", (_raw(name),)))
    for family_item, reply in zip(small, await _run(client, calls), strict=True):
        if isinstance(reply, ResponseError):
            snap.wrong_types.append((family_item[2], "changed"))
            continue
        _store_small(snap, family_item[0], family_item[1], reply)
    if any(name == keys.starts for _, _, name in usable):
        (size,) = await _run(client, [("HLEN", (_raw(keys.starts),))])
        snap.starts_fields = size if isinstance(size, int) else 0
    # Tasks created after the scan but already referenced: read them too, so
    # a live queue does not show its newest entries as orphans.
    referenced = {
        *snap.ready,
        *snap.pready,
        *(i for i in snap.delayed if not i.startswith(RATE_WAKE)),
        *snap.leases,
        *snap.dead,
        *(i for ids in snap.parks.values() for i in ids),
        *(i for ids in snap.held.values() for i in ids),
        *(i for ids in snap.inflight.values() for i in ids),
    }
    await _read_tasks(client, snap, sorted(set(tasks) | referenced), max_payload)
    if snap.fence is not None:
        # Read again after the tasks: the counter only grows, so no token a
        # live claim handed out while the tasks were read is above it.
        (again,) = await _run(client, [("GET", (_raw(keys.fence),))])
        if not isinstance(again, ResponseError):
            snap.fence = _opt(again)
    return snap


def _store_collection(
    snap: Snapshot, family: str, item: str, values: list[Any]
) -> None:
    if family in ("delayed", "leases", "dead", "pready"):
        setattr(snap, family, [_text(member) for member, _ in values])
    elif family == "backlog":
        snap.backlog = {_text(member): float(score) for member, score in values}
    elif family == "waiting":
        snap.waiting = {_text(member) for member, _ in values}
    elif family in ("halted", "paused"):
        setattr(snap, family, {_text(member) for member in values})
    elif family == "ready":
        snap.ready = [_text(v) for v in values]
    elif family == "park":
        snap.parks[item] = [_text(v) for v in values]
    elif family == "held":
        snap.held[item] = [_text(v) for v in values]
    elif family == "inflight":
        snap.inflight[item] = [_text(v) for v in values]


def _store_small(snap: Snapshot, family: str, item: str, reply: Any) -> None:
    if family == "fence":
        snap.fence = _opt(reply)
    elif family in ("conf", "stats"):
        setattr(snap, family, {_text(k): _text(v) for k, v in reply.items()})
    elif family == "gconf":
        snap.gconf[item] = {_text(k): _text(v) for k, v in reply.items()}
    elif family == "grp":
        state = GroupState()
        for raw_name, raw_value in reply.items():
            name, value = _text(raw_name), _text(raw_value)
            if name in ("k", "d", "w"):
                setattr(state, name, value)
            elif name == "!":
                state.halted = value
            elif name.startswith("h:"):
                state.marks[name[2:]] = value
            else:
                state.other.append(name)
        snap.groups[item] = state


async def _read_tasks(
    client: Client, snap: Snapshot, ids: list[str], max_payload: int
) -> None:
    calls: list[tuple[str, tuple[Any, ...]]] = []
    for task_id in ids:
        key = _raw(snap.keys.task(task_id))
        calls += [("HMGET", (key, *_FIELDS)), ("HSTRLEN", (key, "e"))]
    replies = await _run(client, calls)
    # A hash with none of these fields is either gone (expired or deleted
    # since the scan) or a task hash of junk: only those are asked which.
    blank = [
        task_id
        for index, task_id in enumerate(ids)
        if isinstance(replies[2 * index], list)
        and not replies[2 * index + 1]
        and all(v is None for v in replies[2 * index])
    ]
    exists = dict(
        zip(
            blank,
            await _run(client, [("EXISTS", (_raw(snap.keys.task(i)),)) for i in blank]),
            strict=True,
        )
    )
    for index, task_id in enumerate(ids):
        fields, size = replies[2 * index : 2 * index + 2]
        if isinstance(fields, ResponseError):
            continue  # reported as a wrong type when the scan saw the key
        if task_id in exists and not exists[task_id]:
            continue  # expired or deleted since the scan
        state, group, attempt, max_attempts, token, consumer, ended, due, prio, u = (
            _opt(v) for v in fields
        )
        snap.tasks[task_id] = Task(
            task_id,
            state,
            group,
            attempt,
            max_attempts,
            token,
            consumer,
            ended,
            due,
            prio,
            u,
            int(size or 0),
        )
    await _read_envelopes(client, snap, max_payload)


async def _read_envelopes(client: Client, snap: Snapshot, max_payload: int) -> None:
    """Hold each live task's envelope to what a consumer checks before it runs
    one (``_work/runner.py``): its size, that it decodes, its payload's size and
    the envelope's own bounds."""
    limit = max_payload + ENVELOPE_OVERHEAD
    live = []
    for task in snap.tasks.values():
        if task.state not in _LIVE or not task.envelope_size:
            continue
        if task.envelope_size > limit:  # a consumer would not even decode it
            detail = (
                f"the envelope is {task.envelope_size} bytes, over the "
                f"{max_payload} + {ENVELOPE_OVERHEAD} a consumer allows"
            )
            snap.bad_envelopes[task.id] = (True, detail)
        else:
            live.append(task)
    # Pipelines of at most _ENVELOPE_BYTES (and _CHUNK commands), so that a
    # queue of large payloads is never held in memory at once.
    start = 0
    while start < len(live):
        end, size = start, 0
        while (
            end < len(live)
            and end - start < _CHUNK
            and (end == start or size + live[end].envelope_size <= _ENVELOPE_BYTES)
        ):
            size += live[end].envelope_size
            end += 1
        part = live[start:end]
        start = end
        async with client.pipeline(transaction=False) as pipe:
            for task in part:
                pipe.hget(_raw(snap.keys.task(task.id)), "e")
            envelopes: list[Any] = await pipe.execute(raise_on_error=False)
        for task, data in zip(part, envelopes, strict=True):
            if isinstance(data, str):  # a client with decoded replies
                data = data.encode("utf-8", "surrogateescape")
            if isinstance(data, bytes):
                _judge_envelope(snap, task.id, data, max_payload)


def _judge_envelope(
    snap: Snapshot, task_id: str, data: bytes, max_payload: int
) -> None:
    try:
        envelope = unpack(data)
    except Exception as exc:  # noqa: BLE001 - any bytes at all may be stored
        snap.bad_envelopes[task_id] = (False, describe_decode_error(exc))
        return
    if len(envelope.payload) > max_payload:
        detail = (
            f"the payload is {len(envelope.payload)} bytes, over the "
            f"{max_payload} a consumer allows"
        )
        snap.bad_envelopes[task_id] = (True, detail)
    elif problem := out_of_range(envelope):
        snap.bad_envelopes[task_id] = (False, problem)


#: an integer as Redis reads one (HINCRBY, INCR): no sign but "-", no
#: leading zero, no space; 64 bits (checked after)
_REDIS_INT: Final = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")


def _is_int(value: str | None) -> bool:
    """Whether the server takes *value* for an integer: a field the
    scripts increment that it refuses is damage (Python's ``int()`` takes
    "01", " 1" and "+1", the server none of them)."""
    if value is None or value == "-0" or not _REDIS_INT.fullmatch(value):
        return False
    return -(2**63) <= int(value) < 2**63
