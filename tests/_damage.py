"""A healthy queue of every shape, ways to damage it, and a drain that checks
group order: shared by the consistency check's tests (``test_fsck.py``: the
exact problems each damage causes) and the repair's (``test_repair.py``:
each damage repaired, then the queue drained in order by a real Consumer).

Task ids sort in their group's order (``a01`` before ``a02``), so a drain is
in order when each group's tasks first start in sorted order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import redis.asyncio

import aiogroupq
from aiogroupq._check import (
    check as _fsck,
    problems as problem_kinds,
    snapshot as _snapshot,
)
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys

from ._tasks import envelope_of

QUEUE: Final = "damage"
KEYS: Final = QueueKeys(QUEUE)
#: delays, backoffs and rate windows that never end by themselves
FAR_MS: Final = 86_400_000
#: leases nobody outlives in a test
LONG_MS: Final = 600_000
#: generous bound on a drain that takes well under a second when healthy
WAIT: Final = 30.0
#: concurrency of the groups that have more than one slot
LIMITS: Final = {"g3": 2, "g4": 2}
LIVE: Final = frozenset({"queued", "delayed", "running"})


def new(
    task_id: str,
    group: str | None = None,
    *,
    delay_ms: int = 0,
    dedup: str | None = None,
    unique: bool = False,
    priority: int | None = None,
) -> _scripts.NewTask:
    return _scripts.NewTask(
        id=task_id,
        group=group,
        envelope=envelope_of(task_id, group),
        delay_ms=delay_ms,
        max_attempts=3,
        dedup_key=dedup,
        unique=unique,
        priority=priority,
    )


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="surrogateescape")
    return str(value)


@dataclass
class Queue:
    """What :func:`build` made."""

    client: redis.asyncio.Redis
    #: every task id, with its group
    groups: dict[str, str | None] = field(default_factory=dict)
    #: tasks running on consumer "c1", by id
    running: dict[str, _scripts.Claimed] = field(default_factory=dict)
    #: whether priorities are in use
    priorities: bool = False

    async def enqueue(self, *tasks: _scripts.NewTask) -> None:
        ids = await _scripts.enqueue(self.client, KEYS, tasks, dedup_window_ms=LONG_MS)
        assert ids == [t.id for t in tasks]
        for t in tasks:
            self.groups[t.id] = t.group

    async def control(self, op: str, *args: str | int) -> None:
        await _scripts.control(self.client, KEYS, op, *args)

    async def finish(
        self, *outcomes: tuple[str, _scripts.OutcomeKind, str | int]
    ) -> None:
        codes = await _scripts.finish(
            self.client,
            KEYS,
            [
                _scripts.Outcome(i, self.running.pop(i).token, kind, arg, "")
                for i, kind, arg in outcomes
            ],
            retention_ms=LONG_MS,
        )
        assert codes == [1] * len(outcomes)

    async def state(self, task_id: str) -> str | None:
        value = await self.client.hget(KEYS.task(task_id), "s")
        return None if value is None else text(value)

    async def line(self, group: str) -> list[str]:
        return [text(v) for v in await self.client.lrange(KEYS.parked(group), 0, -1)]


async def build(client: redis.asyncio.Redis, *, priorities: bool = False) -> Queue:
    """A healthy queue holding every state a task and a group can be in:

    - g1: a01 running, a02 a03 a04 in line
    - g2: b01 waiting out a retry's backoff (holding its slot), b02 b03 in line
    - g3 (2 slots): c01 c02 running, c03 c04 in line
    - g4 (2 slots, paused): d01 d02 held back, d03 in line
    - g5: halted behind the dead e01, e02 e03 in line
    - g6 (1 start per day): f01 succeeded, f02 held back for the rate (a
      "~g6" wake-up pending), f03 in line
    - g7: q02 ready, q09 in its first delay
    - ungrouped: u01 u02 w01 (holding unique key "w") ready, u03 running,
      v01 delayed; z01 dead, s01 succeeded

    With *priorities*, u01 has priority 5, so that runnable tasks wait in
    ``pready`` instead of ``ready``.
    """
    q = Queue(client, priorities=priorities)
    await q.control("group", "g3", 2, "", "", "", "")
    await q.control("group", "g4", 2, "", "", "", "")
    await q.control("group", "g6", "", 1, FAR_MS, "", "")
    await q.enqueue(
        *(new(f"a0{i}", "g1") for i in range(1, 5)),
        *(new(f"b0{i}", "g2") for i in range(1, 4)),
        *(new(f"c0{i}", "g3") for i in range(1, 5)),
        *(new(f"d0{i}", "g4") for i in range(1, 4)),
        *(new(f"e0{i}", "g5") for i in range(1, 4)),
        *(new(f"f0{i}", "g6") for i in range(1, 4)),
        new("u03"),
        new("z01"),
        new("s01"),
    )
    await q.control("pause", "g4")
    reply = await _scripts.claim(
        client, KEYS, "c1", k=50, lease_ms=LONG_MS, scan_limit=100
    )
    q.running = {t.id: t for t in reply.tasks}
    assert sorted(q.running) == [
        "a01",
        "b01",
        "c01",
        "c02",
        "e01",
        "f01",
        "s01",
        "u03",
        "z01",
    ]
    await q.finish(
        ("b01", "retry", FAR_MS),
        ("e01", "halt", "x"),
        ("z01", "dead", "x"),
        ("s01", "ok", ""),
        ("f01", "ok", ""),
    )
    # f02 is f01's successor: out of the rate, it is held back.
    reply = await _scripts.claim(
        client, KEYS, "c1", k=1, lease_ms=LONG_MS, scan_limit=10
    )
    assert reply.tasks == []
    await q.enqueue(
        new("q02", "g7"),
        new("q09", "g7", delay_ms=FAR_MS),
        new("u01", priority=5 if priorities else None),
        new("u02"),
        new("v01", delay_ms=FAR_MS),
        new("w01", dedup="w", unique=True),
    )
    assert (await _fsck.examine(client, KEYS)).problems == []
    return q


#: a damage: changes the queue's keys the way a bug, a partial write or an
#: operator could; returns nothing
Damage = Callable[[Queue], Awaitable[None]]


async def _replace(client: redis.asyncio.Redis, key: str, kind: str) -> None:
    """*key* becomes a key of another type than *kind* (at once: a live
    consumer's script cannot write the key in between)."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        if kind == "string":
            pipe.rpush(key, "damage")
        else:
            pipe.set(key, "damage")
        await pipe.execute()


def wrong_type(name: str) -> Damage:
    """A fixed key of the queue replaced by one of another type."""

    async def damage(q: Queue) -> None:
        await _replace(q.client, KEYS.prefix + name, _snapshot.FIXED[name])

    return damage


def wrong_type_of(key: str, kind: str) -> Damage:
    async def damage(q: Queue) -> None:
        await _replace(q.client, key, kind)

    return damage


def commands(*calls: tuple[Any, ...]) -> Damage:
    """Raw commands, run in order."""

    async def damage(q: Queue) -> None:
        client: Any = q.client  # execute_command is untyped in redis-py
        for call in calls:
            await client.execute_command(*call)

    return damage


P = KEYS.prefix
G1, G2, G3, G4, G5, G6, G7 = (KEYS.group(f"g{i}") for i in range(1, 8))

#: name -> (damage, the kinds of problem the check reports for it)
DAMAGES: Final[dict[str, tuple[Damage, frozenset[str]]]] = {}
#: damages that themselves break group order (a later task already started
#: beside an earlier one): no repair can undo a start, and both keep their
#: slots until they end, as after a lowered concurrency
UNORDERED: Final = frozenset({"overlap"})


def _register(name: str, fn: Damage, *kinds: str) -> None:
    DAMAGES[name] = (fn, frozenset(kinds))


# -- keys of the wrong type, keys no script makes ---------------------------

_register(
    "ready-wrong-type",
    wrong_type("ready"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
)
_register(
    "delayed-wrong-type",
    wrong_type("delayed"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
    problem_kinds.STUCK_HELD,  # g6's rate wake-up is gone
    problem_kinds.BAD_COUNT,  # and so stats ratewait is off
)
_register(
    "leases-wrong-type",
    wrong_type("leases"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
)
_register(
    "dead-wrong-type",
    wrong_type("dead"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.UNINDEXED_DEAD,
)
_register("fence-wrong-type", wrong_type("fence"), problem_kinds.WRONG_TYPE)
_register("wake-wrong-type", wrong_type("wake"), problem_kinds.WRONG_TYPE)
_register(
    "conf-wrong-type",
    wrong_type("conf"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.BAD_COUNT,  # the paused index: a group's settings count only with gc
    problem_kinds.STUCK_HELD,  # g4's held heads: g4 no longer counts as paused
)
_register("stats-wrong-type", wrong_type("stats"), problem_kinds.WRONG_TYPE)
_register("backlog-wrong-type", wrong_type("backlog"), problem_kinds.WRONG_TYPE)
_register("waiting-wrong-type", wrong_type("waiting"), problem_kinds.WRONG_TYPE)
_register("halted-wrong-type", wrong_type("halted"), problem_kinds.WRONG_TYPE)
_register("paused-wrong-type", wrong_type("paused"), problem_kinds.WRONG_TYPE)
_register(
    "group-hash-wrong-type",
    wrong_type_of(G1, "hash"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.BAD_COUNT,  # stats groups
)
_register(
    "line-wrong-type",
    wrong_type_of(KEYS.parked("g1"), "list"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
    problem_kinds.BAD_COUNT,
)
_register(
    "held-list-wrong-type",
    wrong_type_of(KEYS.held("g4"), "list"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
    problem_kinds.BAD_COUNT,
)
_register(
    "group-settings-wrong-type",
    wrong_type_of(KEYS.group_conf("g6"), "hash"),
    problem_kinds.WRONG_TYPE,
)
_register(
    "task-hash-wrong-type",
    wrong_type_of(KEYS.task("a03"), "hash"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.ORPHAN_ENTRY,
)
_register(
    "running-task-hash-wrong-type",
    wrong_type_of(KEYS.task("a01"), "hash"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.ORPHAN_ENTRY,
    problem_kinds.STRAY_SLOT,
)
_register(
    "recovery-key-wrong-type",
    wrong_type_of(KEYS.inflight("c1"), "set"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.NOT_INFLIGHT,
)
_register(
    "unknown-keys",
    commands(("SET", P + "mystery", "1"), ("SET", P + "t:", "1")),
    problem_kinds.UNKNOWN_KEY,
)

# -- the fence -----------------------------------------------------------------

_register(
    "fence-not-an-integer",
    commands(("SET", P + "fence", "twelve")),
    problem_kinds.BAD_FENCE,
)
_register(
    "fence-below-tokens", commands(("SET", P + "fence", "1")), problem_kinds.BAD_FENCE
)
_register("fence-missing", commands(("DEL", P + "fence")), problem_kinds.BAD_FENCE)

# -- damaged task hashes -------------------------------------------------------

_register(
    "envelope-undecodable",
    commands(("HSET", KEYS.task("a03"), "e", b"\xc1junk")),
    problem_kinds.BAD_ENVELOPE,
)
_register(
    "envelope-out-of-range",
    commands(("HSET", KEYS.task("u01"), "e", b"\x97\xa3u01\xa1t\xc0\xc0\x00\xc0\x00")),
    problem_kinds.BAD_ENVELOPE,
)
_register(
    "envelope-oversized",
    commands(("HSET", KEYS.task("b02"), "e", b"\xc4" + b"x" * 600_000)),
    problem_kinds.OVERSIZED,
)
_register(
    "head-missing-fields",
    commands(("HDEL", KEYS.task("q02"), "m")),
    problem_kinds.BAD_TASK,
)
_register(
    "running-missing-token",
    commands(("HDEL", KEYS.task("a01"), "k")),
    problem_kinds.BAD_TASK,
)
_register(
    "unknown-state",
    commands(("HSET", KEYS.task("a02"), "s", "sleeping")),
    problem_kinds.BAD_TASK,
)
_register(
    "empty-group-field",
    commands(("HSET", KEYS.task("s01"), "g", "")),
    problem_kinds.BAD_TASK,
)

# -- places: lost, doubled, misplaced, orphaned entries ------------------------

_register(
    "lost-ungrouped",
    commands(("LREM", P + "ready", 0, "u02")),
    problem_kinds.LOST_TASK,
)
_register(
    "lost-head",
    commands(("LREM", P + "ready", 0, "q02")),
    problem_kinds.LOST_TASK,
)
_register(
    "lost-in-line",
    commands(
        ("LREM", KEYS.parked("g1"), 0, "a03"),
        ("LREM", KEYS.parked("g1"), 0, "a02"),
    ),
    problem_kinds.LOST_TASK,
    problem_kinds.BAD_COUNT,
)
_register(
    "lost-running",
    commands(("ZREM", P + "leases", "c02")),
    problem_kinds.LOST_TASK,
)
_register(
    "lost-delayed",
    commands(("ZREM", P + "delayed", "q09"), ("ZREM", P + "delayed", "b01")),
    problem_kinds.LOST_TASK,
)
_register(
    "lost-held",
    commands(("LREM", KEYS.held("g4"), 0, "d01")),
    problem_kinds.LOST_TASK,
    problem_kinds.BAD_COUNT,
)
_register(
    "twice-in-ready",
    commands(("RPUSH", P + "ready", "u01")),
    problem_kinds.DUPLICATE,
)
_register(
    "line-task-also-ready",
    commands(("RPUSH", P + "ready", "a04")),
    problem_kinds.DUPLICATE,
    problem_kinds.UNMARKED_HEAD,
)
_register(
    "line-entry-copied-to-its-front",
    commands(("LPUSH", KEYS.parked("g1"), "a04")),
    problem_kinds.DUPLICATE,
    problem_kinds.BAD_COUNT,
)
_register(
    "delayed-task-also-in-line",
    commands(("RPUSH", KEYS.parked("g7"), "q09")),
    problem_kinds.DUPLICATE,
    problem_kinds.BAD_COUNT,
)
_register(
    "ended-task-in-ready",
    commands(("RPUSH", P + "ready", "s01")),
    problem_kinds.MISPLACED,
)
_register(
    "dead-task-in-line",
    commands(("LPUSH", KEYS.parked("g2"), "z01")),
    problem_kinds.MISPLACED,
    problem_kinds.BAD_COUNT,
)
_register(
    "running-task-in-delayed",
    commands(("ZREM", P + "leases", "u03"), ("ZADD", P + "delayed", 0, "u03")),
    problem_kinds.MISPLACED,
)
_register(
    "queued-task-in-dead-index",
    commands(("ZADD", P + "dead", 1, "u02")),
    problem_kinds.MISPLACED,
)
_register(
    "recovery-key-of-another-consumer",
    commands(("SADD", KEYS.inflight("c2"), "a01")),
    problem_kinds.MISPLACED,
)
_register(
    "orphan-entries",
    commands(
        ("RPUSH", P + "ready", "ghost1"),
        ("RPUSH", KEYS.parked("g1"), "ghost2"),
        ("ZADD", P + "delayed", 5, "ghost3"),
        ("ZADD", P + "leases", 5, "ghost4"),
        ("RPUSH", KEYS.held("g4"), "ghost5"),
        ("SADD", KEYS.inflight("c1"), "ghost6"),
        ("ZADD", P + "dead", 5, "ghost7"),
        ("RPUSH", P + "ready", b"\x00\xff"),
    ),
    problem_kinds.ORPHAN_ENTRY,
    problem_kinds.BAD_COUNT,
)
_register(
    "not-in-recovery-key",
    commands(("SREM", KEYS.inflight("c1"), "a01")),
    problem_kinds.NOT_INFLIGHT,
)
_register(
    "dead-not-indexed",
    commands(("ZREM", P + "dead", "z01")),
    problem_kinds.UNINDEXED_DEAD,
)

# -- groups ---------------------------------------------------------------------

_register(
    "group-hash-deleted",
    commands(("DEL", G1)),
    problem_kinds.SLOT_MISMATCH,
    problem_kinds.STUCK_PARK,
    problem_kinds.BAD_COUNT,
)
_register(
    "stray-mark",
    commands(("HSET", G1, "h:zz9", "@"), ("HINCRBY", G1, "k", 1)),
    problem_kinds.STRAY_SLOT,
)
_register(
    "stray-mark-holds-the-slot",
    commands(("HDEL", G7, "h:q02"), ("HSET", G7, "h:zz9", "@")),
    problem_kinds.STRAY_SLOT,
    problem_kinds.UNMARKED_HEAD,
)
_register(
    "unmarked-head",
    commands(("HDEL", G7, "h:q02"), ("HINCRBY", G7, "k", -1)),
    problem_kinds.UNMARKED_HEAD,
)
_register(
    "unmarked-held-head",
    commands(("HDEL", G4, "h:d02"), ("HINCRBY", G4, "k", -1)),
    problem_kinds.UNMARKED_HEAD,
)
_register(
    "running-mark-wrong",
    commands(("HSET", G1, "h:a01", "@")),
    problem_kinds.SLOT_MISMATCH,
)
_register(
    "retry-unmarked",
    commands(("HDEL", G2, "h:b01")),
    problem_kinds.SLOT_MISMATCH,
    problem_kinds.BAD_COUNT,
    problem_kinds.STUCK_PARK,  # by its marks, g2 has a free slot
)
_register(
    "line-task-marked",
    commands(("HSET", G1, "h:a03", "@"), ("HINCRBY", G1, "k", 1)),
    problem_kinds.SLOT_MISMATCH,
)
_register(
    "first-delay-marked",
    commands(("HSET", G7, "h:q09", "r"), ("HINCRBY", G7, "k", 1)),
    problem_kinds.SLOT_MISMATCH,
)
_register(
    "stuck-line",
    commands(("HDEL", G5, "!"), ("SREM", P + "halted", "g5")),
    problem_kinds.STUCK_PARK,
)
_register(
    "stuck-held",
    commands(("HDEL", KEYS.group_conf("g4"), "p"), ("SREM", P + "paused", "g4")),
    problem_kinds.STUCK_HELD,
)
_register(
    "stray-halt-marker",
    commands(("HSET", G1, "!", "nobody"), ("SADD", P + "halted", "g1")),
    problem_kinds.STRAY_SLOT,
)
_register(
    "overlap",
    commands(
        ("LREM", KEYS.parked("g1"), 0, "a02"),
        ("HINCRBY", G1, "w", -1),
        ("HINCRBY", P + "stats", "parked", -1),
        ("HSET", KEYS.task("a02"), "s", "running", "k", 999, "c", "c1", "a", 1),
        ("ZADD", P + "leases", 10**13, "a02"),
        ("SADD", KEYS.inflight("c1"), "a02"),
        ("SET", P + "fence", 999),
    ),
    problem_kinds.GROUP_OVERLAP,
    problem_kinds.SLOT_MISMATCH,
    problem_kinds.BAD_COUNT,  # the backlog index
)
_register(
    "group-counts",
    commands(("HSET", G1, "k", 7, "d", 2, "w", "many"), ("HSET", G2, "junk", 1)),
    problem_kinds.BAD_COUNT,
)
_register(
    "empty-group-hash-left",
    commands(("HSET", KEYS.group("g9"), "k", 0, "d", 0, "w", 0)),
    problem_kinds.BAD_COUNT,
)

# -- indexes, counters, conf flags ------------------------------------------------

_register(
    "indexes",
    commands(
        ("ZADD", P + "backlog", 9, "g1"),
        ("ZREM", P + "waiting", "g2"),
        ("ZADD", P + "waiting", 1, "g9"),
        ("SREM", P + "halted", "g5"),
        ("SADD", P + "paused", "g1"),
    ),
    problem_kinds.BAD_COUNT,
)
_register(
    "stats",
    commands(
        ("HSET", P + "stats", "parked", 99, "held", -1, "groups", "x"),
        ("HSET", P + "stats", "ratewait", 0, "enqueued", "many"),
    ),
    problem_kinds.BAD_COUNT,
)
_register(
    "conf-flags",
    commands(("HDEL", P + "conf", "gc", "uq")),
    problem_kinds.BAD_CONF,
    problem_kinds.BAD_COUNT,
    problem_kinds.STUCK_HELD,
)


# -- priorities in use (the queue built with priorities=True) ---------------------

_register(
    "prio-pready-wrong-type",
    wrong_type("pready"),
    problem_kinds.WRONG_TYPE,
    problem_kinds.LOST_TASK,
)
_register("prio-pseq-wrong-type", wrong_type("pseq"), problem_kinds.WRONG_TYPE)
_register(
    "prio-flag-missing",
    commands(("HDEL", P + "conf", "pu")),
    problem_kinds.BAD_CONF,
)
_register(
    "prio-lost",
    commands(("ZREM", P + "pready", "u02"), ("ZREM", P + "pready", "q02")),
    problem_kinds.LOST_TASK,
)
_register(
    "prio-also-in-ready",
    commands(("RPUSH", P + "ready", "u01")),
    problem_kinds.DUPLICATE,
)


def needs_priorities(name: str) -> bool:
    """Whether the damage *name* is made to a queue built with priorities."""
    return name.startswith("prio-")


async def unblock(q: Queue) -> None:
    """Let every live task run now: resume g4, release g5, lift g6's rate,
    everything delayed due, every lease (consumer c1's) expired."""
    await q.control("resume", "g4")
    await _scripts.dead_action(q.client, KEYS, "release", ["g5"])
    await q.control("group", "g6", "", "", "", "", "")
    for key in (KEYS.delayed, KEYS.leases):
        members: list[Any] = await q.client.zrange(key, 0, -1)
        if members:
            await q.client.zadd(key, dict.fromkeys(members, 0.0), xx=True)


@dataclass
class Drain:
    """What a drain by a real Consumer saw."""

    #: (group, id) of each start, in order
    starts: list[tuple[str | None, str]] = field(default_factory=list)
    #: most tasks of each group running at once
    most: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    #: the tasks that were live when the drain began, by their end state
    ends: dict[str, str | None] = field(default_factory=dict)

    def first_starts(self, group: str) -> list[str]:
        seen: list[str] = []
        for g, task_id in self.starts:
            if g == group and task_id not in seen:
                seen.append(task_id)
        return seen


async def drain(q: Queue) -> Drain:
    """Unblock the queue and run it dry with a real Consumer."""
    await unblock(q)
    ids = sorted(q.groups)
    states = [await q.state(i) for i in ids]
    live = [i for i, s in zip(ids, states, strict=True) if s in LIVE]
    seen = Drain()
    running: dict[str | None, int] = defaultdict(int)

    async def handler(payload: object) -> None:
        del payload
        info = aiogroupq.current_task()
        seen.starts.append((info.group, info.id))
        running[info.group] += 1
        seen.most[info.group] = max(seen.most[info.group], running[info.group])
        await anyio.sleep(0.002)
        running[info.group] -= 1

    async with aiogroupq.Consumer(
        q.client,
        queue=QUEUE,
        handlers={"t": handler},
        concurrency=8,
        grace_period=1.0,
    ):
        with anyio.fail_after(WAIT):
            while True:
                ends = {i: await q.state(i) for i in live}
                if not any(s in LIVE for s in ends.values()):
                    break
                await anyio.sleep(0.02)
    seen.ends = ends
    return seen


def assert_in_order(q: Queue, seen: Drain, *, ordered: bool = True) -> None:
    """Every task live before the drain succeeded; each group's tasks first
    started in order (a group with n slots: each within n - 1 places of its
    turn, as its n heads run side by side), never more at once than its
    slots."""
    assert {i: s for i, s in seen.ends.items() if s != "succeeded"} == {}
    for group in {g for g in q.groups.values() if g is not None}:
        limit = LIMITS.get(group, 1)
        started = seen.first_starts(group)
        turns = sorted(started)
        for place, task_id in enumerate(started):
            assert not ordered or abs(turns.index(task_id) - place) < limit, (
                group,
                started,
            )
        assert not ordered or seen.most.get(group, 0) <= limit, group
