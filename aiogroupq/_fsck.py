"""A consistency check of one queue's Redis keys (``fsck`` for a queue).

:func:`check` reads every key of a queue and reports each broken invariant of
the Lua scripts (see the header of ``_lua/_lib.lua``) as a :class:`Problem`.
The tests run it after every scenario and every model step; operators can run
it against a stopped or quiet queue.

The check reads with plain pipelines, not one atomic snapshot (a queue may be
far too large for a single ``MULTI``), so on a busy queue a problem may be a
race between two reads: run it again before you believe it. Its cost is
O(keys + list entries) time and memory, a handful of round trips.

Every kind of problem is a module constant (``LOST_TASK``, ``STUCK_PARK``, …);
their docstring-comments say what each means.
"""

from __future__ import annotations

__all__ = (
    "BAD_FENCE",
    "BAD_TASK",
    "DUPLICATE",
    "GROUP_OVERLAP",
    "LOCK_MISMATCH",
    "LOST_TASK",
    "MISPLACED",
    "NOT_INFLIGHT",
    "ORPHAN_ENTRY",
    "STRAY_LOCK",
    "STUCK_PARK",
    "UNINDEXED_DEAD",
    "UNKNOWN_KEY",
    "UNMARKED_HEAD",
    "WRONG_SLOT",
    "WRONG_TYPE",
    "Problem",
    "check",
    "check_queue",
)

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from redis.crc import key_slot
from redis.exceptions import ResponseError

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
#: a ready / park / delayed / lease / recovery-key / dead entry names no task
ORPHAN_ENTRY: Final = "orphan-entry"
#: an entry names a task whose state, group or owner does not belong there
MISPLACED: Final = "misplaced"
#: a live task is in more than one place (or twice in one list)
DUPLICATE: Final = "duplicate"
#: a live task is in no place: nothing will ever run or recover it
LOST_TASK: Final = "lost-task"
#: a running task is missing from its owner's recovery key ``inflight:<c>``
NOT_INFLIGHT: Final = "not-inflight"
#: a group's running task does not hold the group's lock with its token
LOCK_MISMATCH: Final = "lock-mismatch"
#: a lock held by nobody: a token of no running task of the group, or an
#: ``@``/``!`` marker whose task is not the group's pending head / halting task
STRAY_LOCK: Final = "stray-lock"
#: a grouped task in the ready list that is not its group's ``@`` head
UNMARKED_HEAD: Final = "unmarked-head"
#: a non-empty parked list behind a free group: nothing will ever move it
STUCK_PARK: Final = "stuck-park"
#: two running tasks in one group (group exclusion is broken)
GROUP_OVERLAP: Final = "group-overlap"
#: a fencing token above the counter, which would hand it out again
BAD_FENCE: Final = "bad-fence"
#: a dead task missing from the dead-letter index, where nobody would find it
UNINDEXED_DEAD: Final = "unindexed-dead"

_LIVE: Final = frozenset({"queued", "delayed", "running"})
_TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled"})
# Fixed keys by their name after the prefix.
_FIXED: Final = ("ready", "delayed", "leases", "wake", "fence", "dead")
# Per-task / per-group / per-consumer keys by the word before the first ":"
# (every method of QueueKeys; a key the scripts gain must be added here).
_FAMILIES: Final = frozenset(
    {"t", "lock", "park", "inflight", "consumer", "lastclaim", "dedup", "done"}
)
# Families that are plain STRINGs, only type-checked.
_STRINGS: Final = frozenset({"dedup", "consumer", "lastclaim"})
# Fields read from a task hash, in this order.
_FIELDS: Final = ("s", "g", "a", "m", "k", "c")
# Commands per pipeline round trip: bounds one reply's size on a big queue.
_CHUNK: Final = 1000


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant.

    :ivar kind: what is broken, e.g. ``"stuck-park"`` (a parked line behind
        a free group) or ``"lost-task"`` (a live task in no list)
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
class _Task:
    """The fields of one task hash that the check needs."""

    id: str
    state: str | None
    group: str | None
    attempt: str | None
    max_attempts: str | None
    token: str | None
    consumer: str | None
    has_envelope: bool


@dataclass(slots=True)
class _Snapshot:
    """Everything read from Redis, decoded to str."""

    tasks: dict[str, _Task] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    delayed: list[str] = field(default_factory=list)
    leases: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    fence: str | None = None
    locks: dict[str, str] = field(default_factory=dict)
    parks: dict[str, list[str]] = field(default_factory=dict)
    inflight: dict[str, list[str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def _text(value: object) -> str:
    # surrogateescape keeps any byte string round-trippable and comparable.
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


def _opt(value: object) -> str | None:
    return None if value is None else _text(value)


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


# Per task: the fields, whether the (possibly large, binary) envelope is
# there without reading it, and whether the hash exists at all.
_TASK_CALLS: Final = 3


def _task_calls(key: object) -> list[tuple[str, tuple[Any, ...]]]:
    return [("HMGET", (key, *_FIELDS)), ("HEXISTS", (key, "e")), ("HLEN", (key,))]


def _parse_task(task_id: str, replies: list[Any]) -> _Task | ResponseError | None:
    """A task from its :func:`_task_calls` replies; None if the hash is gone."""
    for reply in replies:
        if isinstance(reply, ResponseError):
            return reply
    fields, has_e, size = replies
    if not size:
        return None  # expired or deleted since the scan
    state, group, attempt, max_attempts, token, consumer = (_opt(v) for v in fields)
    return _Task(
        task_id, state, group, attempt, max_attempts, token, consumer, bool(has_e)
    )


async def _read(client: Redis, keys: QueueKeys) -> _Snapshot:
    snap = _Snapshot()
    slot = key_slot(keys.ready.encode())
    fixed = {name: keys.prefix + name for name in _FIXED}
    scanned: list[tuple[Any, str]] = [
        (raw, _text(raw))
        async for raw in client.scan_iter(match=keys.pattern(), count=1000)
    ]
    # The fixed keys are read whether or not the scan saw them (absent = empty).
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("LRANGE", (fixed["ready"], 0, -1)),
        ("ZRANGE", (fixed["delayed"], 0, -1)),
        ("ZRANGE", (fixed["leases"], 0, -1)),
        ("LLEN", (fixed["wake"],)),
        ("GET", (fixed["fence"],)),
        ("ZRANGE", (fixed["dead"], 0, -1)),
    ]
    # What each later reply belongs to: (family, name, key) per command group.
    plan: list[tuple[str, str, str]] = []
    fixed_names = set(fixed.values())
    for raw, name in scanned:
        raw_bytes = raw if isinstance(raw, bytes) else name.encode()
        if key_slot(raw_bytes) != slot:
            snap.problems.append(
                Problem(WRONG_SLOT, None, None, f"{name} is not in slot {slot}")
            )
        if name in fixed_names:
            continue
        rest = name.removeprefix(keys.prefix)
        family, sep, item = rest.partition(":")
        if not sep or not item or family not in _FAMILIES:
            snap.problems.append(
                Problem(UNKNOWN_KEY, None, None, f"{name}: no script makes this key")
            )
            continue
        plan.append((family, item, name))
        if family == "t":
            calls += _task_calls(raw)
        elif family == "lock" or family in _STRINGS:
            calls.append(("GET", (raw,)))
        elif family == "park":
            calls.append(("LRANGE", (raw, 0, -1)))
        elif family == "inflight":
            calls.append(("SMEMBERS", (raw,)))
        else:  # done: a LIST of tokens for Producer.result's waiters
            calls.append(("LLEN", (raw,)))
    replies = iter(await _run(client, calls))

    def typed(reply: Any, key: str, default: Any) -> Any:
        if isinstance(reply, ResponseError):
            snap.problems.append(Problem(WRONG_TYPE, None, None, f"{key}: {reply}"))
            return default
        return reply

    snap.ready = [_text(v) for v in typed(next(replies), fixed["ready"], [])]
    snap.delayed = [_text(v) for v in typed(next(replies), fixed["delayed"], [])]
    snap.leases = [_text(v) for v in typed(next(replies), fixed["leases"], [])]
    typed(next(replies), fixed["wake"], 0)
    snap.fence = _opt(typed(next(replies), fixed["fence"], None))
    snap.dead = [_text(v) for v in typed(next(replies), fixed["dead"], [])]
    for family, item, key in plan:
        if family == "t":
            task = _parse_task(item, [next(replies) for _ in range(_TASK_CALLS)])
            if isinstance(task, ResponseError):
                typed(task, key, None)
            elif task is not None:
                snap.tasks[item] = task
        elif family == "lock":
            value = typed(next(replies), key, None)
            if value is not None:
                snap.locks[item] = _text(value)
        elif family == "park":
            snap.parks[item] = [_text(v) for v in typed(next(replies), key, [])]
        elif family == "inflight":
            snap.inflight[item] = [_text(v) for v in typed(next(replies), key, [])]
        else:
            typed(next(replies), key, None)
    # Tasks created after the scan but already referenced: read them too, so
    # a live queue does not show its newest entries as orphans.
    referenced = {
        *snap.ready,
        *snap.delayed,
        *snap.leases,
        *snap.dead,
        *(i for ids in snap.parks.values() for i in ids),
        *(i for ids in snap.inflight.values() for i in ids),
        *(v[1:] for v in snap.locks.values() if v[:1] in ("@", "!")),
    }
    late = sorted(referenced - snap.tasks.keys())
    if late:
        calls = [c for task_id in late for c in _task_calls(keys.task(task_id))]
        replies = iter(await _run(client, calls))
        for task_id in late:
            task = _parse_task(task_id, [next(replies) for _ in range(_TASK_CALLS)])
            # (A wrong type is reported when a scan sees the key.)
            if isinstance(task, _Task):
                snap.tasks[task_id] = task
    return snap


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

    def __init__(self, snap: _Snapshot) -> None:
        self.snap = snap
        self.problems = list(snap.problems)
        # The primary place of each task: "ready", "park:<g>", "delayed",
        # "leases", once per entry (so a double entry counts twice).
        self.places: dict[str, list[str]] = defaultdict(list)

    def report(
        self, kind: str, task_id: str | None, group: str | None, detail: str
    ) -> None:
        self.problems.append(Problem(kind, task_id, group, detail))

    def run(self) -> list[Problem]:
        for task in self.snap.tasks.values():
            self.check_fields(task)
        self.collect_places()
        for task in self.snap.tasks.values():
            self.check_place(task)
        self.check_inflight()
        self.check_dead_index()
        self.check_groups()
        self.check_fence()
        return sorted(
            set(self.problems),
            key=lambda p: (p.kind, p.group or "", p.task_id or "", p.detail),
        )

    # -- tasks --------------------------------------------------------------

    def check_fields(self, task: _Task) -> None:
        missing = []
        if task.state not in _LIVE | _TERMINAL:
            self.report(BAD_TASK, task.id, task.group, f"unknown state {task.state!r}")
            return
        if task.group == "":
            self.report(BAD_TASK, task.id, None, "empty group field g")
        if task.state in _LIVE:
            if not task.has_envelope:
                missing.append("e")
            if not _is_int(task.attempt):
                missing.append("a")
            if not _is_int(task.max_attempts):
                missing.append("m")
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

    def collect_places(self) -> None:
        containers: list[tuple[str, str | None, Iterable[str]]] = [
            ("ready", None, self.snap.ready),
            ("delayed", None, self.snap.delayed),
            ("leases", None, self.snap.leases),
        ]
        containers += [("park", g, ids) for g, ids in self.snap.parks.items()]
        for where, group, ids in containers:
            label = where if group is None else f"park:{group}"
            for task_id in ids:
                if task_id not in self.snap.tasks:
                    self.report(ORPHAN_ENTRY, task_id, group, f"{label} names no task")
                else:
                    self.places[task_id].append(label)

    def check_place(self, task: _Task) -> None:
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
                "queued": "the ready list or its parked list",
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
        allowed = {
            "queued": {"ready"} | ({f"park:{task.group}"} if task.group else set()),
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

    def check_groups(self) -> None:
        tasks = self.snap.tasks
        running: dict[str, list[_Task]] = defaultdict(list)
        for task in tasks.values():
            if task.group and task.state == "running":
                running[task.group].append(task)
        in_ready: dict[str, list[str]] = defaultdict(list)
        ready_set = set(self.snap.ready)
        for task_id in self.snap.ready:
            entry = tasks.get(task_id)
            if entry is not None and entry.group and entry.state == "queued":
                in_ready[entry.group].append(task_id)
        groups = (
            set(self.snap.locks)
            | {g for g, ids in self.snap.parks.items() if ids}
            | set(running)
            | set(in_ready)
        )
        delayed_set = set(self.snap.delayed)
        for g in sorted(groups):
            lock = self.snap.locks.get(g)
            holders = running.get(g, [])
            if len(holders) > 1:
                ids = ", ".join(sorted(t.id for t in holders))
                self.report(GROUP_OVERLAP, None, g, f"running at once: {ids}")
            for task in holders:
                if lock != task.token:
                    self.report(
                        LOCK_MISMATCH,
                        task.id,
                        g,
                        f"lock is {lock!r}, the running task's token {task.token!r}",
                    )
            if lock is None:
                if self.snap.parks.get(g):
                    self.report(
                        STUCK_PARK,
                        None,
                        g,
                        f"{len(self.snap.parks[g])} parked behind a free group"
                        " with no head pending",
                    )
            elif not holders:
                self.check_idle_lock(g, lock, ready_set, delayed_set)
            for task_id in in_ready[g]:
                if lock != "@" + task_id:
                    self.report(
                        UNMARKED_HEAD,
                        task_id,
                        g,
                        f"in the ready list but the lock is {lock!r}",
                    )

    def check_idle_lock(
        self, g: str, lock: str, ready: set[str], delayed: set[str]
    ) -> None:
        """A lock of a group with no running task must mark its pending head
        (``@id``, in the ready list or its retry backoff) or its halting dead
        task (``!id``)."""
        marker, target = lock[:1], lock[1:]
        if marker not in ("@", "!"):
            self.report(
                STRAY_LOCK, None, g, f"token {lock!r} but no task of it is running"
            )
            return
        task = self.snap.tasks.get(target)
        if task is None:
            self.report(STRAY_LOCK, target, g, f"lock {lock!r} names no task")
            return
        if task.group != g:
            why = f"lock {lock!r} names a task of group {task.group!r}"
        elif marker == "!":
            if task.state == "dead":
                return
            why = f"halting lock {lock!r} names a {task.state} task"
        elif (task.state == "queued" and target in ready) or (
            task.state == "delayed" and target in delayed
        ):
            return
        else:
            where = "parked" if target not in ready | delayed else "misplaced"
            why = f"head lock {lock!r} names a {task.state} task ({where})"
        self.report(STRAY_LOCK, target, g, why)

    def check_fence(self) -> None:
        tokens = [
            (t.id, t.group, int(t.token))
            for t in self.snap.tasks.values()
            if t.token is not None and _is_int(t.token)
        ]
        if not tokens:
            return
        if not _is_int(self.snap.fence):
            self.report(
                BAD_FENCE, None, None, f"fence is {self.snap.fence!r} but tokens exist"
            )
            return
        fence = int(self.snap.fence or 0)
        for task_id, group, token in tokens:
            if token > fence:
                self.report(
                    BAD_FENCE,
                    task_id,
                    group,
                    f"token {token} is above the fence counter {fence}",
                )


async def check(client: Redis, keys: QueueKeys) -> list[Problem]:
    """Walk one queue's keys and report every broken invariant.

    :param client: any client of the queue's server (bytes or decoded replies)
    :param keys: the queue's key names
    :return: the problems, sorted by kind, group and task; empty if the queue
        is consistent
    """
    snap = await _read(client, keys)
    return _Checker(snap).run()


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
