"""A consistency check of one queue's Redis keys (``fsck`` for a queue).

:func:`check` reads every key of a queue and reports each broken invariant of
the Lua scripts (see the headers of ``_lua/lib/*.lua``) as a :class:`Problem`;
``_repair.py`` fixes what it finds. The tests run it after every scenario and
every model step; operators run it as ``aiogroupq check``.

The check reads with plain pipelines, not one atomic snapshot (a queue may be
far too large for a single ``MULTI``), so on a busy queue a problem may be a
race between two reads: run it again before you believe it. Long lists and
sets are read in slices of :data:`SLICE` entries, so that no single command
holds the server for long; the cost is O(keys + entries) time and memory.

Every kind of problem is a module constant (``LOST_TASK``, ``STUCK_PARK``, …);
their comments say what each means.
"""

from __future__ import annotations

__all__ = (
    "BAD_COUNT",
    "BAD_ENVELOPE",
    "BAD_FENCE",
    "BAD_TASK",
    "DUPLICATE",
    "GROUP_OVERLAP",
    "LOST_TASK",
    "MISPLACED",
    "NOT_INFLIGHT",
    "ORPHAN_ENTRY",
    "OVERSIZED",
    "SLOT_MISMATCH",
    "STRAY_SLOT",
    "STUCK_PARK",
    "UNINDEXED_DEAD",
    "UNKNOWN_KEY",
    "UNMARKED_HEAD",
    "WRONG_SLOT",
    "WRONG_TYPE",
    "Problem",
    "Snapshot",
    "check",
    "check_queue",
    "read",
)

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import msgspec
from redis.crc import key_slot
from redis.exceptions import ResponseError

from ._codec import unpack
from ._connection import RedisLike, open_client, unavailable_as_error
from ._keys import QueueKeys

if TYPE_CHECKING:
    from redis.asyncio import Redis

#: a key of the queue hashes to another cluster slot than the queue's fixed keys
WRONG_SLOT: Final = "wrong-slot"
#: a key under the queue's prefix that no script creates
UNKNOWN_KEY: Final = "unknown-key"
#: a key of the queue holds the wrong Redis type (e.g. ``ready`` is not a LIST)
WRONG_TYPE: Final = "wrong-type"
#: a task hash misses a field its state needs, or has an unusable value
BAD_TASK: Final = "bad-task"
#: a live task's envelope does not decode (the consumer would dead-letter it)
BAD_ENVELOPE: Final = "bad-envelope"
#: a live task's envelope is larger than the consumers' payload limit
OVERSIZED: Final = "oversized"
#: a ready / line / delayed / lease / recovery-key / dead entry names no task
ORPHAN_ENTRY: Final = "orphan-entry"
#: an entry names a task whose state, group or owner does not belong there
MISPLACED: Final = "misplaced"
#: a live task is in more than one place (or twice in one list)
DUPLICATE: Final = "duplicate"
#: a live task is in no place: nothing will ever run or recover it
LOST_TASK: Final = "lost-task"
#: a running task is missing from its owner's recovery key ``inflight:<c>``
NOT_INFLIGHT: Final = "not-inflight"
#: a group's slot holder is marked for another state than its task is in
#: (e.g. a running task whose mark is not its fencing token)
SLOT_MISMATCH: Final = "slot-mismatch"
#: a slot mark or halt marker of a group names no live task of the group
#: (a mark left behind holds a slot for ever)
STRAY_SLOT: Final = "stray-slot"
#: a grouped task in the ready list (or held back) without its slot mark
UNMARKED_HEAD: Final = "unmarked-head"
#: a group has a line while a slot is free and it is neither paused nor
#: halted: nothing will ever move the line
STUCK_PARK: Final = "stuck-park"
#: more running tasks in a group than its concurrency and slots allow: with
#: concurrency 1, two at once (exclusion is broken)
GROUP_OVERLAP: Final = "group-overlap"
#: the fence counter is not an integer, or a token is above it
BAD_FENCE: Final = "bad-fence"
#: a dead task missing from the dead-letter index, where nobody would find it
UNINDEXED_DEAD: Final = "unindexed-dead"
#: a count kept by the scripts (a group's k, d or w, a stats counter, the
#: backlog, waiting, halted or paused index) disagrees with the keys
BAD_COUNT: Final = "bad-count"

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
#: default payload limit the check holds envelopes to (the consumers')
DEFAULT_MAX_PAYLOAD: Final = 512 * 1024
# Fields read from a task hash, in this order.
_FIELDS: Final = ("s", "g", "a", "m", "k", "c", "ft", "dt", "p")


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant.

    :ivar kind: what is broken, e.g. ``"stuck-park"`` (a group's line behind
        a free slot) or ``"lost-task"`` (a live task in no list)
    :ivar task_id: the task concerned, if one is
    :ivar group: the group concerned, if one is
    :ivar detail: a sentence for humans (key names, values seen)
    """

    kind: str
    task_id: str | None
    group: str | None
    detail: str

    def __str__(self) -> str:
        where = "".join(
            f" {label} {value!r}"
            for label, value in (("task", self.task_id), ("group", self.group))
            if value is not None
        )
        return f"{self.kind}{where}: {self.detail}"


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
    unknown: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: live tasks whose envelope does not decode or is too large: id ->
    #: (BAD_ENVELOPE or OVERSIZED, why)
    bad_envelopes: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: True if the queue has no key at all
    empty: bool = True

    def limit(self, group: str) -> int:
        """The group's concurrency (its own, else the queue's default)."""
        own = self.gconf.get(group, {}).get("c") or self.conf.get("c")
        return int(own) if own and own.isdigit() else 1

    def is_paused(self, group: str) -> bool:
        """Whether the group is paused."""
        return self.gconf.get(group, {}).get("p") == "1"


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
    client: Redis, calls: Sequence[tuple[str, tuple[Any, ...]]]
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


async def _read_all(client: Redis, key: str, kind: str) -> list[Any] | None:
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
        if "WRONGTYPE" in str(exc):
            return None
        raise


async def _types(client: Redis, names: Sequence[str]) -> list[str]:
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
    client: Redis, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> Snapshot:
    """Read every key of a queue into a :class:`Snapshot` (no checks yet,
    except the ones reading makes: slots, unknown keys, wrong types,
    undecodable envelopes)."""
    snap = Snapshot(keys)
    slot = key_slot(_raw(keys.ready))
    names = sorted(
        {_text(raw) async for raw in client.scan_iter(match=keys.pattern(), count=1000)}
    )
    snap.empty = not names
    classified: list[tuple[str, str, str, str]] = []  # family, item, key, type
    for name in names:
        if key_slot(_raw(name)) != slot:
            snap.problems.append(
                Problem(WRONG_SLOT, None, None, f"{name} is not in slot {slot}")
            )
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
            continue
        usable.append((family, item, name))

    tasks: list[str] = []
    small: list[tuple[str, str, str]] = []  # hashes and strings: one command each
    for family, item, name in usable:
        kind = FIXED.get(family) or FAMILIES[family]
        if family == "t":
            tasks.append(item)
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
    # wake, rate, done: only their type matters


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
    client: Redis, snap: Snapshot, ids: list[str], max_payload: int
) -> None:
    calls: list[tuple[str, tuple[Any, ...]]] = []
    for task_id in ids:
        key = _raw(snap.keys.task(task_id))
        calls += [("HMGET", (key, *_FIELDS)), ("HSTRLEN", (key, "e")), ("HLEN", (key,))]
    replies = await _run(client, calls)
    for index, task_id in enumerate(ids):
        fields, size, length = replies[3 * index : 3 * index + 3]
        if isinstance(fields, ResponseError):
            continue  # reported as a wrong type when the scan saw the key
        if not length:
            continue  # expired or deleted since the scan
        state, group, attempt, max_attempts, token, consumer, ended, due, prio = (
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
            int(size or 0),
        )
    # Envelopes of live tasks: decodable, and within the payload limit.
    live = [t for t in snap.tasks.values() if t.state in _LIVE and t.envelope_size]
    for start in range(0, len(live), _CHUNK):
        part = live[start : start + _CHUNK]
        async with client.pipeline(transaction=False) as pipe:
            for task in part:
                if task.envelope_size <= max_payload:
                    pipe.hget(_raw(snap.keys.task(task.id)), "e")
                else:
                    pipe.echo(b"")
            envelopes: list[Any] = await pipe.execute(raise_on_error=False)
        for task, envelope in zip(part, envelopes, strict=True):
            if task.envelope_size > max_payload:
                snap.bad_envelopes[task.id] = (
                    OVERSIZED,
                    f"{task.envelope_size} bytes, over the limit of {max_payload}",
                )
            elif isinstance(envelope, bytes):
                try:
                    unpack(envelope)
                except (msgspec.DecodeError, ValueError, RecursionError) as exc:
                    snap.bad_envelopes[task.id] = (BAD_ENVELOPE, str(exc))


def _is_int(value: str | None) -> bool:
    if value is None:
        return False
    try:
        int(value)
    except ValueError:
        return False
    return True


class _Checker:
    """Applies every rule to one snapshot; :meth:`run` returns the problems."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.problems = list(snap.problems)
        # Every place of each task: "ready", "park:<g>", "held:<g>", "delayed",
        # "leases", once per entry (so a double entry counts twice).
        self.places: dict[str, list[str]] = defaultdict(list)

    def report(
        self, kind: str, task_id: str | None, group: str | None, detail: str
    ) -> None:
        self.problems.append(Problem(kind, task_id, group, detail))

    def run(self) -> list[Problem]:
        snap = self.snap
        for name in snap.unknown:
            self.report(UNKNOWN_KEY, None, None, f"{name}: no script makes this key")
        for name, kind in snap.wrong_types:
            self.report(WRONG_TYPE, None, None, f"{name} is a {kind}")
        for task in snap.tasks.values():
            self.check_fields(task)
        self.collect_places()
        for task in snap.tasks.values():
            self.check_place(task)
        self.check_inflight()
        self.check_dead_index()
        self.check_groups()
        self.check_indexes()
        self.check_fence()
        return sorted(
            set(self.problems),
            key=lambda p: (p.kind, p.group or "", p.task_id or "", p.detail),
        )

    # -- tasks --------------------------------------------------------------

    def check_fields(self, task: Task) -> None:
        missing = []
        if task.state not in _KNOWN_STATES:
            self.report(BAD_TASK, task.id, task.group, f"unknown state {task.state!r}")
            return
        if task.group == "":
            self.report(BAD_TASK, task.id, None, "empty group field g")
        if task.state in _LIVE:
            if not task.envelope_size:
                missing.append("e")
            if not _is_int(task.attempt):
                missing.append("a")
            if not _is_int(task.max_attempts):
                missing.append("m")
            if task.priority is not None and not _is_int(task.priority):
                missing.append("p")
        if task.state == "running":
            if not _is_int(task.token):
                missing.append("k")
            if not task.consumer:
                missing.append("c")
            if _is_int(task.attempt) and int(task.attempt or 0) < 1:
                missing.append("a>=1")
        if missing:
            self.report(
                BAD_TASK,
                task.id,
                task.group,
                f"{task.state} task lacks valid field(s) {', '.join(missing)}",
            )
        if task.id in self.snap.bad_envelopes:
            kind, detail = self.snap.bad_envelopes[task.id]
            self.report(kind, task.id, task.group, detail)

    def collect_places(self) -> None:
        snap = self.snap
        containers: list[tuple[str, Iterable[str]]] = [
            ("ready", snap.ready),
            ("ready", snap.pready),
            ("delayed", (i for i in snap.delayed if not i.startswith(RATE_WAKE))),
            ("leases", snap.leases),
        ]
        containers += [(f"park:{g}", ids) for g, ids in snap.parks.items()]
        containers += [(f"held:{g}", ids) for g, ids in snap.held.items()]
        for label, ids in containers:
            for task_id in ids:
                if task_id not in snap.tasks:
                    self.report(ORPHAN_ENTRY, task_id, None, f"{label} names no task")
                else:
                    self.places[task_id].append(label)

    def check_place(self, task: Task) -> None:
        places = self.places.get(task.id, [])
        if task.state in _TERMINAL:
            for label in sorted(set(places)):
                self.report(
                    MISPLACED, task.id, task.group, f"{task.state} task in {label}"
                )
            return
        if task.state not in _LIVE:
            return  # reported as BAD_TASK
        if not places:
            where = {
                "queued": "the ready list, its group's line or held list",
                "delayed": "the delayed set",
                "running": "the lease set (it would never be recovered)",
            }[task.state]
            self.report(LOST_TASK, task.id, task.group, f"{task.state}, not in {where}")
            return
        if len(places) > 1:
            self.report(
                DUPLICATE,
                task.id,
                task.group,
                f"{task.state} task in {', '.join(sorted(places))}",
            )
            return
        grouped = {f"park:{task.group}", f"held:{task.group}"} if task.group else set()
        allowed = {
            "queued": {"ready"} | grouped,
            "delayed": {"delayed"},
            "running": {"leases"},
        }[task.state]
        if places[0] not in allowed:
            self.report(
                MISPLACED, task.id, task.group, f"{task.state} task in {places[0]}"
            )

    def check_inflight(self) -> None:
        owners: dict[str, set[str]] = defaultdict(set)
        for consumer, ids in self.snap.inflight.items():
            for task_id in ids:
                owners[task_id].add(consumer)
                task = self.snap.tasks.get(task_id)
                if task is None:
                    self.report(
                        ORPHAN_ENTRY,
                        task_id,
                        None,
                        f"inflight:{consumer} names no task",
                    )
                elif task.state != "running" or task.consumer != consumer:
                    self.report(
                        MISPLACED,
                        task_id,
                        task.group,
                        f"inflight:{consumer} holds a {task.state} task"
                        f" owned by {task.consumer!r}",
                    )
        for task in self.snap.tasks.values():
            if (
                task.state == "running"
                and task.consumer
                and task.consumer not in owners[task.id]
            ):
                self.report(
                    NOT_INFLIGHT,
                    task.id,
                    task.group,
                    f"running on {task.consumer!r} but not in its recovery key",
                )

    def check_dead_index(self) -> None:
        indexed = set(self.snap.dead)
        for task_id in indexed:
            task = self.snap.tasks.get(task_id)
            if task is None:
                self.report(ORPHAN_ENTRY, task_id, None, "dead index names no task")
            elif task.state != "dead":
                self.report(
                    MISPLACED, task_id, task.group, f"{task.state} task in dead index"
                )
        for task in self.snap.tasks.values():
            if task.state == "dead" and task.id not in indexed:
                self.report(UNINDEXED_DEAD, task.id, task.group, "not in dead index")

    # -- groups -------------------------------------------------------------

    def group_names(self) -> set[str]:
        snap = self.snap
        return (
            set(snap.groups)
            | {g for g, ids in snap.parks.items() if ids}
            | {g for g, ids in snap.held.items() if ids}
            | {t.group for t in snap.tasks.values() if t.group and t.state in _LIVE}
        )

    def check_groups(self) -> None:
        snap = self.snap
        live: dict[str, list[Task]] = defaultdict(list)
        for task in snap.tasks.values():
            if task.group and task.state in _LIVE:
                live[task.group].append(task)
        ready = set(snap.ready) | set(snap.pready)
        for g in sorted(self.group_names()):
            state = snap.groups.get(g, GroupState())
            self.check_group(g, state, live.get(g, []), ready)

    def check_group(
        self, g: str, state: GroupState, tasks: list[Task], ready: set[str]
    ) -> None:
        snap = self.snap
        by_id = {t.id: t for t in tasks}
        line = snap.parks.get(g, [])
        held = set(snap.held.get(g, []))
        limit = snap.limit(g)
        running = [t for t in tasks if t.state == "running"]
        # More running than its slots allow (a lowered concurrency lets the
        # tasks already holding slots finish).
        if len(running) > max(limit, len(state.marks)):
            ids = ", ".join(sorted(t.id for t in running))
            self.report(GROUP_OVERLAP, None, g, f"running at once: {ids}")
        first_delay = 0
        for task in tasks:
            mark = state.marks.get(task.id)
            expected = self.expected_mark(task, ready, held, line)
            if expected == "first":
                first_delay += 1
                if mark is not None and mark != "r":
                    self.report(
                        SLOT_MISMATCH, task.id, g, f"delayed task marked {mark!r}"
                    )
            elif expected == "line":
                if mark is not None:
                    self.report(
                        SLOT_MISMATCH, task.id, g, f"task in the line marked {mark!r}"
                    )
            elif expected is not None and mark is None:
                where = "ready list" if expected == "@" else "held list"
                kind = UNMARKED_HEAD if expected in ("@", "~") else SLOT_MISMATCH
                self.report(
                    kind, task.id, g, f"{task.state} task ({where}) has no mark"
                )
            elif expected is not None and mark != expected:
                self.report(
                    SLOT_MISMATCH,
                    task.id,
                    g,
                    f"{task.state} task marked {mark!r}, expected {expected!r}",
                )
        for task_id, mark in state.marks.items():
            if task_id not in by_id:
                self.report(
                    STRAY_SLOT, task_id, g, f"mark {mark!r} of no live task of g"
                )
        if state.halted is not None:
            halting = snap.tasks.get(state.halted)
            if halting is None or halting.state != "dead" or halting.group != g:
                what = "no task" if halting is None else f"a {halting.state} task"
                self.report(STRAY_SLOT, state.halted, g, f"halted behind {what}")
        counts = {"k": len(state.marks), "d": first_delay, "w": len(line)}
        for name, want in counts.items():
            have = getattr(state, name) or "0"
            if not _is_int(have) or int(have) != want:
                self.report(BAD_COUNT, None, g, f"{name} is {have!r}, counted {want}")
        for name in state.other:
            self.report(BAD_COUNT, None, g, f"field {name!r} no script writes")
        blocked = state.halted is not None or snap.is_paused(g)
        if line and not blocked and len(state.marks) < limit:
            self.report(
                STUCK_PARK,
                None,
                g,
                f"{len(line)} in line behind {len(state.marks)} of {limit} slots taken",
            )

    def expected_mark(
        self, task: Task, ready: set[str], held: set[str], line: list[str]
    ) -> str | None:
        """What the group's mark of *task* should be: '@', '~', 'r', its
        token, "line", "first" (a first delay: no mark), or None (lost or
        misplaced: reported elsewhere)."""
        if task.state == "running":
            return task.token
        if task.state == "delayed":
            return (
                "r" if _is_int(task.attempt) and int(task.attempt or 0) > 0 else "first"
            )
        if task.id in ready:
            return "@"
        if task.id in held:
            return "~"
        if task.id in line:
            return "line"
        return None

    def check_indexes(self) -> None:
        snap = self.snap
        with_line = {g: len(ids) for g, ids in snap.parks.items() if ids}
        if {g: int(n) for g, n in snap.backlog.items()} != with_line:
            self.report(BAD_COUNT, None, None, "backlog index differs from the lines")
        if snap.waiting != set(with_line):
            self.report(BAD_COUNT, None, None, "waiting index differs from the lines")
        halted = {g for g, s in snap.groups.items() if s.halted is not None}
        if snap.halted != halted:
            self.report(BAD_COUNT, None, None, "halted index differs from the groups")
        paused = {g for g in snap.gconf if snap.is_paused(g)}
        if snap.paused != paused:
            self.report(BAD_COUNT, None, None, "paused index differs from the groups")
        wakes = sum(1 for m in snap.delayed if m.startswith(RATE_WAKE))
        counts = {
            "parked": sum(with_line.values()),
            "held": sum(len(ids) for ids in snap.held.values()),
            "ratewait": wakes,
            "groups": len(snap.groups),
        }
        for name, want in counts.items():
            have = snap.stats.get(name, "0")
            if not _is_int(have) or int(have) != want:
                self.report(
                    BAD_COUNT, None, None, f"stats {name} is {have!r}, counted {want}"
                )

    def check_fence(self) -> None:
        tokens = [
            (t.id, t.group, int(t.token))
            for t in self.snap.tasks.values()
            if t.token is not None and _is_int(t.token)
        ]
        fence = self.snap.fence
        if fence is not None and not _is_int(fence):
            self.report(BAD_FENCE, None, None, f"fence is {fence!r}, not an integer")
            return
        if not tokens:
            return
        if fence is None:
            self.report(BAD_FENCE, None, None, "fence is missing but tokens exist")
            return
        for task_id, group, token in tokens:
            if token > int(fence):
                self.report(
                    BAD_FENCE,
                    task_id,
                    group,
                    f"token {token} is above the fence counter {fence}",
                )


def problems_of(snap: Snapshot) -> list[Problem]:
    """Apply every rule to a snapshot."""
    return _Checker(snap).run()


async def check(
    client: Redis, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[Problem]:
    """Walk one queue's keys and report every broken invariant.

    :param client: any client of the queue's server (bytes or decoded replies)
    :param keys: the queue's key names
    :param max_payload: the consumers' payload limit, in bytes
    :return: the problems, sorted by kind, group and task; empty if the queue
        is consistent
    """
    return problems_of(await read(client, keys, max_payload=max_payload))


async def check_queue(redis: RedisLike, queue: str) -> list[Problem]:
    """Check one queue's Redis keys and return every broken invariant found.

    An empty list means the queue is consistent. The reads are not one atomic
    snapshot: on a busy queue, confirm a problem by checking again.

    :param redis: a ``redis://`` URL or a ``redis.asyncio.Redis`` client
    :param queue: the queue name
    :raises ConfigurationError: for a bad queue name or client
    :raises RedisUnavailableError: if Redis cannot be reached
    """
    keys = QueueKeys(queue)
    return await _checked(redis, keys)


@unavailable_as_error
async def _checked(redis: RedisLike, keys: QueueKeys) -> list[Problem]:
    async with open_client(redis, retry=True) as client:
        return await check(client, keys)


def tally(problems: Iterable[Problem]) -> Counter[str]:
    """How many problems of each kind."""
    return Counter(p.kind for p in problems)
