"""A second reading of what the check's first reading found.

The first reading (``_check/snapshot.py``) is not one atomic snapshot: on
a busy queue a task may end between the read of its group's hash and the
read of its own, and the rules then see a mark of no live task, a succeeded
task in the lease set, a count one off. So each problem found is read
again: every key it involves (the tasks named, their groups' hashes,
settings, lines and held lists, the entries of those tasks and groups in the
queue's lists, sets and indexes, the recovery keys of their owners, ``conf``,
``stats`` and the fence) in one ``MULTI`` (one atomic reading of those
keys), patched into a copy of the first reading, and the rules applied again.
A problem is reported only if the second reading shows it too (same kind,
task, group and key): a race is gone by then, damage is still there.

A user refused ``MULTI`` (the read-only rule of ``docs/operations.md``) gets
the same second reading as a plain pipeline: a race must then happen twice
over the same task or group to be reported.

The stats gauges (``parked``, ``held``, ``ratewait``, ``groups``) count
every line, held list, rate wake-up and group hash of the partition: no
reading short of the whole partition can confirm them. They are confirmed
only by a first reading during which nothing moved (the ``stats`` hash read
before and after it is the same); otherwise they are *unsure*, as the
repair, which recounts them only on a queue at rest, treats them.
"""

from __future__ import annotations

__all__ = ("Confirmed", "confirm", "is_gauge")

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import NoPermissionError, RedisClusterException, ResponseError

from .problems import BAD_COUNT, Problem
from .snapshot import (
    _FIELDS,
    RATE_WAKE,
    GroupState,
    Snapshot,
    Task,
    _opt,
    _raw,
    _store_small,
    _text,
)

if TYPE_CHECKING:
    from .._store.connection import Client

#: stats fields that count the whole partition (see the module's docstring)
GAUGES: Final = ("parked", "held", "ratewait", "groups")
#: most commands in one MULTI: a larger reading is split by group (each
#: group, with its tasks, is read atomically)
_MAX_COMMANDS: Final = 2000
#: readings of the involved keys, each adding the tasks the previous one
#: found holding a group's slots or owned by another consumer
_ROUNDS: Final = 3
_LIVE: Final = frozenset({"queued", "delayed", "running"})


@dataclass(slots=True)
class Confirmed:
    """What the second reading made of the first one's problems.

    :ivar snapshot: the first reading with the involved keys read again
    :ivar problems: the problems both readings show
    :ivar unsure: stats gauges off in a reading during which the queue moved
    """

    snapshot: Snapshot
    problems: list[Problem]
    unsure: list[Problem] = field(default_factory=list)


def _subject(p: Problem) -> tuple[str, str | None, str | None, str | None]:
    return (p.kind, p.task_id, p.group, p.key)


def is_gauge(p: Problem, snap: Snapshot) -> bool:
    """Whether *p* is a stats gauge differing from what was counted (the
    rule's detail is ``stats <gauge> is <value>, counted <n>``)."""
    return (
        p.kind == BAD_COUNT
        and p.group is None
        and p.key == snap.keys.stats
        and any(p.detail.startswith(f"stats {name} is ") for name in GAUGES)
        and ", counted " in p.detail
    )


@dataclass(slots=True)
class _Involved:
    tasks: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    #: task id -> the consumers whose recovery key to ask about it
    owners: dict[str, set[str]] = field(default_factory=dict)

    def add_task(self, snap: Snapshot, task_id: str) -> None:
        self.tasks.add(task_id)
        asked = self.owners.setdefault(task_id, set())
        task = snap.tasks.get(task_id)
        if task is not None:
            if task.consumer:
                asked.add(task.consumer)
            if task.group:
                self.groups.add(task.group)
        asked.update(c for c, ids in snap.inflight.items() if task_id in ids)


def _index_differences(snap: Snapshot) -> set[str]:
    """Groups whose entries in the backlog, waiting, halted or paused index
    disagree with their keys (what ``rules.check_indexes`` compares)."""
    with_line = {g: len(ids) for g, ids in snap.parks.items() if ids}
    backlog = {g: int(n) for g, n in snap.backlog.items()}
    halted = {g for g, s in snap.groups.items() if s.halted is not None}
    paused = {g for g in snap.gconf if snap.is_paused(g)}
    return (
        {g for g, _ in set(backlog.items()) ^ set(with_line.items())}
        | (snap.waiting ^ set(with_line))
        | (snap.halted ^ halted)
        | (snap.paused ^ paused)
    )


#: families of per-group keys: a problem about one involves its group
_GROUP_KEYS: Final = ("park:", "held:", "grp:", "gconf:")


def _involved(snap: Snapshot, problems: Iterable[Problem]) -> _Involved:
    inv = _Involved()
    prefix = snap.keys.prefix
    # The groups whose line or held list holds each id (a task may sit in
    # another group's: misplaced).
    lined: dict[str, set[str]] = {}
    for lists in (snap.parks, snap.held):
        for g, ids in lists.items():
            for task_id in ids:
                lined.setdefault(task_id, set()).add(g)
    for p in problems:
        if p.task_id is not None:
            inv.add_task(snap, p.task_id)
            inv.groups |= lined.get(p.task_id, set())
        if p.group is not None:
            inv.groups.add(p.group)
        for family in _GROUP_KEYS:
            if p.key is not None and p.key.startswith(prefix + family):
                inv.groups.add(p.key[len(prefix + family) :])
        if p.key is not None and p.key.startswith(prefix + "inflight:"):
            consumer = p.key[len(prefix + "inflight:") :]
            if p.task_id is not None:
                inv.owners[p.task_id].add(consumer)
        if p.kind == BAD_COUNT and p.group is None and p.key != snap.keys.stats:
            inv.groups |= _index_differences(snap)
    # A group's rules read its slot holders and its delayed tasks too.
    moving: dict[str, list[str]] = {}
    for task in snap.tasks.values():
        if task.group and task.state in ("running", "delayed"):
            moving.setdefault(task.group, []).append(task.id)
    for g in sorted(inv.groups):
        state = snap.groups.get(g, GroupState())
        for holder in (*state.marks, state.halted, *moving.get(g, [])):
            if holder is not None:
                inv.add_task(snap, holder)
    return inv


@dataclass(slots=True)
class _Fresh:
    """What the second reading found, before it is patched in."""

    ready: dict[str, int] = field(default_factory=dict)
    zsets: dict[str, dict[str, bool]] = field(default_factory=dict)
    inflight: dict[str, dict[str, bool]] = field(default_factory=dict)
    index: dict[str, dict[str, float | bool | None]] = field(default_factory=dict)


_Read = tuple[str, tuple[Any, ...], Callable[[Any], None]]


def _reads(snap: Snapshot, inv: _Involved, fresh: _Fresh) -> list[list[_Read]]:
    """The commands of the second reading, by unit (a group with its tasks,
    or an ungrouped task): each unit is read atomically."""
    by_group: dict[str, list[str]] = {g: [] for g in inv.groups}
    units: list[list[_Read]] = []
    for task_id in sorted(inv.tasks):
        task = snap.tasks.get(task_id)
        owners = inv.owners.get(task_id, set())
        if task is not None and task.group:
            by_group.setdefault(task.group, []).append(task_id)
        else:
            units.append(_task_reads(snap, task_id, owners, fresh))
    for g, ids in sorted(by_group.items()):
        unit = _group_reads(snap, g, fresh)
        for task_id in ids:
            unit += _task_reads(snap, task_id, inv.owners.get(task_id, set()), fresh)
        units.append(unit)
    return units


def _group_reads(snap: Snapshot, g: str, fresh: _Fresh) -> list[_Read]:
    keys = snap.keys

    def grp(reply: Any) -> None:
        if reply:
            _store_small(snap, "grp", g, reply)
        else:
            snap.groups.pop(g, None)

    def gconf(reply: Any) -> None:
        if reply:
            _store_small(snap, "gconf", g, reply)
        else:
            snap.gconf.pop(g, None)

    def line(where: dict[str, list[str]]) -> Callable[[Any], None]:
        def store(reply: Any) -> None:
            if reply:
                where[g] = [_text(v) for v in reply]
            else:
                where.pop(g, None)

        return store

    def index(name: str) -> Callable[[Any], None]:
        def store(reply: Any) -> None:
            # backlog: the line's length; the others: whether g is in them
            fresh.index.setdefault(name, {})[g] = (
                (None if reply is None else float(reply))
                if name == "backlog"
                else bool(reply)
            )

        return store

    def wake(reply: Any) -> None:
        fresh.zsets.setdefault("delayed", {})[RATE_WAKE + g] = reply is not None

    raw = _raw(g)
    return [
        ("HGETALL", (_raw(keys.group(g)),), grp),
        ("HGETALL", (_raw(keys.group_conf(g)),), gconf),
        ("LRANGE", (_raw(keys.parked(g)), 0, -1), line(snap.parks)),
        ("LRANGE", (_raw(keys.held(g)), 0, -1), line(snap.held)),
        ("ZSCORE", (_raw(keys.delayed), _raw(RATE_WAKE + g)), wake),
        ("ZSCORE", (_raw(keys.backlog), raw), index("backlog")),
        ("ZSCORE", (_raw(keys.waiting), raw), index("waiting")),
        ("SISMEMBER", (_raw(keys.halted), raw), index("halted")),
        ("SISMEMBER", (_raw(keys.paused), raw), index("paused")),
    ]


def _task_reads(
    snap: Snapshot, task_id: str, owners: set[str], fresh: _Fresh
) -> list[_Read]:
    keys = snap.keys
    key = _raw(keys.task(task_id))
    raw = _raw(task_id)
    got: dict[str, Any] = {}

    def fields(reply: Any) -> None:
        got["fields"] = reply

    def size(reply: Any) -> None:
        got["size"] = reply

    def exists(reply: Any) -> None:
        if "fields" not in got:  # not a hash: reported as a wrong type
            return
        if not reply:
            snap.tasks.pop(task_id, None)
            snap.bad_envelopes.pop(task_id, None)
            return
        state, group, attempt, most, token, consumer, ended, due, prio, u = (
            _opt(v) for v in got["fields"]
        )
        task = Task(
            task_id,
            state,
            group,
            attempt,
            most,
            token,
            consumer,
            ended,
            due,
            prio,
            u,
            int(got.get("size") or 0),
        )
        snap.tasks[task_id] = task
        if task.state not in _LIVE:  # a consumer no longer looks at it
            snap.bad_envelopes.pop(task_id, None)

    def ready(reply: Any) -> None:
        fresh.ready[task_id] = len(reply or [])

    def member(name: str) -> Callable[[Any], None]:
        def store(reply: Any) -> None:
            fresh.zsets.setdefault(name, {})[task_id] = reply is not None

        return store

    def inflight(consumer: str) -> Callable[[Any], None]:
        def store(reply: Any) -> None:
            fresh.inflight.setdefault(consumer, {})[task_id] = bool(reply)

        return store

    reads: list[_Read] = [
        ("HMGET", (key, *_FIELDS), fields),
        ("HSTRLEN", (key, "e"), size),
        ("EXISTS", (key,), exists),
        ("LPOS", (_raw(keys.ready), raw, "COUNT", 0), ready),
    ]
    reads += [
        ("ZSCORE", (_raw(getattr(keys, name)), raw), member(name))
        for name in ("pready", "delayed", "leases", "dead")
    ]
    reads += [
        ("SISMEMBER", (_raw(keys.inflight(c)), raw), inflight(c))
        for c in sorted(owners)
    ]
    return reads


async def _execute(
    client: Client, reads: Sequence[_Read], atomic: bool
) -> list[Any] | None:
    """The replies (errors in place), or None if ``MULTI`` is refused: by
    the user's ACL, or by a cluster client of a redis-py without cluster
    transactions (before 6.0), whose refusal comes before anything is sent."""
    try:
        async with client.pipeline(transaction=atomic) as pipe:
            for command, args, _ in reads:
                pipe.execute_command(command, *args)
            replies: list[Any] = await pipe.execute(raise_on_error=False)
    except (NoPermissionError, RedisClusterException):
        if atomic:
            return None
        raise
    return replies


async def _read_again(client: Client, snap: Snapshot, inv: _Involved) -> list[str]:
    """Read the involved keys again into *snap* (a copy of the first
    reading; a later round reads a superset of the keys, so it may patch
    the same copy again); return the tasks to read as well in another round
    (see the end)."""
    fresh = _Fresh()
    keys = snap.keys

    def whole(name: str) -> Callable[[Any], None]:
        def store(reply: Any) -> None:
            if not isinstance(reply, ResponseError):
                _store_small(snap, name, "", reply)

        return store

    globals_: list[_Read] = [
        ("HGETALL", (_raw(keys.conf),), whole("conf")),
        ("HGETALL", (_raw(keys.stats),), whole("stats")),
        ("GET", (_raw(keys.fence),), whole("fence")),
    ]
    chunks: list[list[_Read]] = [[]]
    for unit in _reads(snap, inv, fresh):
        if chunks[-1] and len(chunks[-1]) + len(unit) > _MAX_COMMANDS:
            chunks.append([])
        chunks[-1] += unit
    atomic = True
    for chunk in chunks:
        # The globals last: the fence is then read after every token.
        reads = chunk + globals_
        replies = await _execute(client, reads, atomic)
        if replies is None:
            atomic = False
            replies = await _execute(client, reads, atomic)
            assert replies is not None
        for (_, _, apply), reply in zip(reads, replies, strict=True):
            if not isinstance(reply, Exception):  # a wrong type: reported
                apply(reply)
    _patch_lists(snap, fresh)
    # Slot holders not read, and tasks now owned by a consumer not asked:
    # the next round reads them too.
    missing: set[str] = set()
    for g in inv.groups:
        state = snap.groups.get(g, GroupState())
        missing.update(i for i in (*state.marks, state.halted) if i is not None)
    missing -= inv.tasks
    for task_id in inv.tasks:
        task = snap.tasks.get(task_id)
        if (
            task is not None
            and task.consumer
            and task.consumer not in inv.owners.get(task_id, set())
        ):
            missing.add(task_id)
    return sorted(missing)


def _patch_lists(snap: Snapshot, fresh: _Fresh) -> None:
    """Put the new reading's entries of the involved tasks and groups into
    the queue-wide lists, sets and indexes of *snap* (each rebuilt once)."""
    if fresh.ready:
        kept = [i for i in snap.ready if i not in fresh.ready]
        snap.ready = kept + [i for i, n in fresh.ready.items() for _ in range(n)]
    for name, members in fresh.zsets.items():
        current: list[str] = getattr(snap, name)
        kept = [i for i in current if i not in members]
        setattr(snap, name, kept + [i for i, there in members.items() if there])
    for consumer, members in fresh.inflight.items():
        ids = [i for i in snap.inflight.get(consumer, []) if i not in members]
        ids += [i for i, there in members.items() if there]
        if ids:
            snap.inflight[consumer] = ids
        else:
            snap.inflight.pop(consumer, None)
    for g, score in fresh.index.get("backlog", {}).items():
        if score is None:
            snap.backlog.pop(g, None)
        else:
            snap.backlog[g] = float(score)
    for name in ("waiting", "halted", "paused"):
        members_: set[str] = getattr(snap, name)
        for g, there in fresh.index.get(name, {}).items():
            if there:
                members_.add(g)
            else:
                members_.discard(g)


async def confirm(
    client: Client,
    first: Snapshot,
    problems: Sequence[Problem],
    *,
    quiet: bool,
    judge: Callable[[Snapshot], list[Problem]],
) -> Confirmed:
    """The problems of *first* that a second reading of their keys shows too.

    :param quiet: whether nothing moved while *first* was read (its gauges
        are then right or truly wrong)
    :param judge: the rules (``rules.find_problems``)
    """
    if not problems:
        return Confirmed(first, [])
    inv = _involved(first, problems)
    # One copy for every round (a deep copy of a large queue's reading costs
    # seconds and its memory again).
    snap = copy.deepcopy(first)
    for _ in range(_ROUNDS):
        more = await _read_again(client, snap, inv)
        if not more:
            break
        for task_id in more:
            inv.add_task(snap, task_id)  # with its owner in the new reading
    again = judge(snap)
    seen = {_subject(p) for p in again}
    confirmed: list[Problem] = []
    unsure: list[Problem] = []
    for p in problems:
        if is_gauge(p, first):
            (confirmed if quiet else unsure).append(p)
        elif _subject(p) in seen:
            confirmed.append(p)
    # Report what the second reading says (its values are the newer).
    newer = {_subject(p): p for p in again}
    return Confirmed(
        snap,
        [newer.get(_subject(p), p) for p in confirmed],
        unsure,
    )
