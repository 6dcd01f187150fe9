"""A consistency check of one queue's Redis keys (``fsck`` for a queue).

:func:`check` reads every key of a queue and reports each broken invariant of
the Lua scripts (see the headers of ``_lua/lib/*.lua``) as a :class:`Problem`;
``_inspect/repair.py`` fixes what it finds. The tests run it after every scenario and
every model step; operators run it as ``aiogroupq check``.

The reading (``_inspect/snapshot.py``) uses plain pipelines, not one atomic snapshot
(a queue may be far too large for a single ``MULTI``), so on a busy queue a
problem may be a race between two reads: run it again before you believe it.
Long lists and sets are read in slices of ``_snapshot.SLICE`` entries, so
that no single command holds the server for long; the cost is O(keys +
entries) time and memory.

Every kind of problem is a module constant (``LOST_TASK``, ``STUCK_PARK``, …);
their comments say what each means. The rules mirror what the scripts do,
not only what they write: a group's settings count only once the queue's
``conf`` says some group has settings (``gc``), exactly as ``group()`` in
``lib/groups.lua`` reads them, and an envelope is held to the same limits a
consumer holds it to (``_work/runner.py``).
"""

from __future__ import annotations

__all__ = (
    "BAD_CONF",
    "BAD_COUNT",
    "BAD_ENVELOPE",
    "BAD_FENCE",
    "BAD_LAYOUT",
    "BAD_TASK",
    "DEFAULT_MAX_PAYLOAD",
    "DUPLICATE",
    "FAMILIES",
    "FIXED",
    "GROUP_OVERLAP",
    "LOST_TASK",
    "MISPLACED",
    "NOT_INFLIGHT",
    "ORPHAN_ENTRY",
    "OVERSIZED",
    "SLOT_MISMATCH",
    "STRAY_SLOT",
    "STUCK_HELD",
    "STUCK_PARK",
    "UNINDEXED_DEAD",
    "UNKNOWN_KEY",
    "UNMARKED_HEAD",
    "WRONG_PARTITION",
    "WRONG_SLOT",
    "WRONG_TYPE",
    "GroupState",
    "Problem",
    "Snapshot",
    "check",
    "check_queue",
    "examine",
    "examine_partitions",
    "examine_queue",
    "read",
)

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .._store import layout as _layout
from .._store.connection import RedisLike, open_client, unavailable_as_error
from .._store.partition import Partitions, crc
from .snapshot import (
    DEFAULT_MAX_PAYLOAD,
    FAMILIES,
    FIXED,
    RATE_WAKE,
    GroupState,
    Snapshot,
    Task,
    _is_int,
    read,
)

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys

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
#: a live task's envelope or payload is larger than the consumers' payload
#: limit (they would dead-letter it unread)
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
#: a group holds heads back (``held:<g>``) while it is neither paused nor
#: halted and no rate wake-up ``~<g>`` is pending: nothing will bring them back
STUCK_HELD: Final = "stuck-held"
#: more running tasks in a group than its concurrency and slots allow: with
#: concurrency 1, two at once (exclusion is broken)
GROUP_OVERLAP: Final = "group-overlap"
#: the fence counter is not an integer, or a token is above it
BAD_FENCE: Final = "bad-fence"
#: a dead task missing from the dead-letter index, where nobody would find it
UNINDEXED_DEAD: Final = "unindexed-dead"
#: a count kept by the scripts (a group's k, d or w, a stats counter, the
#: backlog, waiting, halted or paused index) disagrees with the keys, or a
#: group's hash is left over with nothing in it
BAD_COUNT: Final = "bad-count"
#: a group has live tasks in a partition it does not belong to under the
#: queue's layout, or in two partitions at once (its order and exclusion
#: across them are not kept); only a repartition's protocol moves groups
WRONG_PARTITION: Final = "wrong-partition"
#: a partition's copy of the queue's partition layout (conf ``parts``)
#: differs from partition 0's: its enqueues refuse tasks routed by the
#: queue's layout (any client entering brings a copy one step behind up to
#: date)
BAD_LAYOUT: Final = "bad-layout"
#: a flag of the queue's ``conf`` hash that the scripts rely on is missing:
#: ``pu`` while tasks wait in ``pready`` or carry a priority (claims would
#: never look there), ``gc`` while groups have settings (they would be
#: ignored), ``uq`` while tasks hold unique keys (never freed)
BAD_CONF: Final = "bad-conf"

_LIVE: Final = frozenset({"queued", "delayed", "running"})
_TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled", "expired"})
_KNOWN_STATES: Final = _LIVE | _TERMINAL


@dataclass(frozen=True, slots=True)
class Problem:
    """One broken invariant.

    :ivar kind: what is broken, e.g. ``"stuck-park"`` (a group's line behind
        a free slot) or ``"lost-task"`` (a live task in no list)
    :ivar task_id: the task concerned, if one is
    :ivar group: the group concerned, if one is
    :ivar detail: a sentence for humans (key names, values seen)
    :ivar key: the key concerned, if one is
    """

    kind: str
    task_id: str | None
    group: str | None
    detail: str
    #: the key concerned (the list holding a wrong entry, the damaged key, the
    #: task's or the group's hash), if one is
    key: str | None = None

    def __str__(self) -> str:
        where = "".join(
            f" {label} {value!r}"
            for label, value in (("task", self.task_id), ("group", self.group))
            if value is not None
        )
        return f"{self.kind}{where}: {self.detail}"


class _Checker:
    """Applies every rule to one snapshot; :meth:`run` returns the problems."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.keys = snap.keys
        self.problems: list[Problem] = []
        # Every place of each task: "ready", "pready", "park:<g>", "held:<g>",
        # "delayed", "leases", once per entry (so a double entry counts twice).
        self.places: dict[str, list[str]] = defaultdict(list)

    def report(
        self,
        kind: str,
        task_id: str | None,
        group: str | None,
        detail: str,
        key: str | None = None,
    ) -> None:
        self.problems.append(Problem(kind, task_id, group, detail, key))

    def place_key(self, label: str) -> str:
        """The key of a place label ("ready", "park:g", ...)."""
        return self.keys.prefix + label

    def run(self) -> list[Problem]:
        snap = self.snap
        for name in snap.outside_slot:
            detail = f"{name} is not in the slot of {self.keys.ready}"
            self.report(WRONG_SLOT, None, None, detail, name)
        for name in snap.unknown:
            self.report(
                UNKNOWN_KEY, None, None, f"{name}: no script makes this key", name
            )
        for name, kind in snap.wrong_types:
            self.report(WRONG_TYPE, None, None, f"{name} is a {kind}", name)
        for task in snap.tasks.values():
            self.check_fields(task)
        self.collect_places()
        for task in snap.tasks.values():
            self.check_place(task)
        self.check_inflight()
        self.check_dead_index()
        self.check_groups()
        self.check_indexes()
        self.check_conf()
        self.check_fence()
        return sorted(
            set(self.problems),
            key=lambda p: (p.kind, p.group or "", p.task_id or "", p.detail),
        )

    # -- tasks --------------------------------------------------------------

    def check_fields(self, task: Task) -> None:
        key = self.keys.task(task.id)
        missing = []
        if task.state not in _KNOWN_STATES:
            self.report(
                BAD_TASK, task.id, task.group, f"unknown state {task.state!r}", key
            )
            return
        if task.group == "":
            self.report(BAD_TASK, task.id, None, "empty group field g", key)
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
                key,
            )
        if task.id in self.snap.bad_envelopes:
            too_large, detail = self.snap.bad_envelopes[task.id]
            kind = OVERSIZED if too_large else BAD_ENVELOPE
            self.report(kind, task.id, task.group, detail, key)

    def collect_places(self) -> None:
        snap = self.snap
        containers: list[tuple[str, Iterable[str]]] = [
            ("ready", snap.ready),
            ("pready", snap.pready),
            ("delayed", (i for i in snap.delayed if not i.startswith(RATE_WAKE))),
            ("leases", snap.leases),
        ]
        containers += [(f"park:{g}", ids) for g, ids in snap.parks.items()]
        containers += [(f"held:{g}", ids) for g, ids in snap.held.items()]
        for label, ids in containers:
            for task_id in ids:
                if task_id not in snap.tasks:
                    self.report(
                        ORPHAN_ENTRY,
                        task_id,
                        None,
                        f"{label} names no task",
                        self.place_key(label),
                    )
                else:
                    self.places[task_id].append(label)

    def check_place(self, task: Task) -> None:
        places = self.places.get(task.id, [])
        if task.state in _TERMINAL:
            for label in sorted(set(places)):
                self.report(
                    MISPLACED,
                    task.id,
                    task.group,
                    f"{task.state} task in {label}",
                    self.place_key(label),
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
            self.report(
                LOST_TASK,
                task.id,
                task.group,
                f"{task.state}, not in {where}",
                self.keys.task(task.id),
            )
            return
        if len(places) > 1:
            self.report(
                DUPLICATE,
                task.id,
                task.group,
                f"{task.state} task in {', '.join(sorted(places))}",
                self.keys.task(task.id),
            )
            return
        grouped = {f"park:{task.group}", f"held:{task.group}"} if task.group else set()
        allowed = {
            "queued": {"ready", "pready"} | grouped,
            "delayed": {"delayed"},
            "running": {"leases"},
        }[task.state]
        if places[0] not in allowed:
            self.report(
                MISPLACED,
                task.id,
                task.group,
                f"{task.state} task in {places[0]}",
                self.place_key(places[0]),
            )

    def check_inflight(self) -> None:
        owners: dict[str, set[str]] = defaultdict(set)
        for consumer, ids in self.snap.inflight.items():
            key = self.keys.inflight(consumer)
            for task_id in ids:
                owners[task_id].add(consumer)
                task = self.snap.tasks.get(task_id)
                if task is None:
                    self.report(
                        ORPHAN_ENTRY,
                        task_id,
                        None,
                        f"inflight:{consumer} names no task",
                        key,
                    )
                elif task.state != "running" or task.consumer != consumer:
                    self.report(
                        MISPLACED,
                        task_id,
                        task.group,
                        f"inflight:{consumer} holds a {task.state} task"
                        f" owned by {task.consumer!r}",
                        key,
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
                    self.keys.inflight(task.consumer),
                )

    def check_dead_index(self) -> None:
        indexed = set(self.snap.dead)
        for task_id in indexed:
            task = self.snap.tasks.get(task_id)
            if task is None:
                self.report(
                    ORPHAN_ENTRY,
                    task_id,
                    None,
                    "dead index names no task",
                    self.keys.dead,
                )
            elif task.state != "dead":
                self.report(
                    MISPLACED,
                    task_id,
                    task.group,
                    f"{task.state} task in dead index",
                    self.keys.dead,
                )
        for task in self.snap.tasks.values():
            if task.state == "dead" and task.id not in indexed:
                self.report(
                    UNINDEXED_DEAD,
                    task.id,
                    task.group,
                    "not in dead index",
                    self.keys.dead,
                )

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
        wakes = snap.rate_wakes()
        for g in sorted(self.group_names()):
            if self.keys.group(g) in self.wrong_typed:
                continue  # reported as WRONG_TYPE; its state is unknown
            state = snap.groups.get(g, GroupState())
            self.check_group(g, state, live.get(g, []), ready, wakes)

    @property
    def wrong_typed(self) -> set[str]:
        return {name for name, _ in self.snap.wrong_types}

    def check_group(
        self,
        g: str,
        state: GroupState,
        tasks: list[Task],
        ready: set[str],
        wakes: set[str],
    ) -> None:
        snap = self.snap
        key = self.keys.group(g)
        by_id = {t.id: t for t in tasks}
        line = snap.parks.get(g, [])
        held_list = snap.held.get(g, [])
        held = set(held_list)
        limit = snap.limit(g)
        running = [t for t in tasks if t.state == "running"]
        # More running than its slots allow (a lowered concurrency lets the
        # tasks already holding slots finish).
        if len(running) > max(limit, len(state.marks)):
            ids = ", ".join(sorted(t.id for t in running))
            self.report(GROUP_OVERLAP, None, g, f"running at once: {ids}", key)
        first_delay = 0
        in_line = set(line)
        for task in tasks:
            mark = state.marks.get(task.id)
            expected = self.expected_mark(task, ready, held, in_line)
            if expected == "first":
                first_delay += 1
                if mark is not None:
                    self.report(
                        SLOT_MISMATCH,
                        task.id,
                        g,
                        f"task in its first delay marked {mark!r}",
                        key,
                    )
            elif expected == "line":
                if mark is not None:
                    self.report(
                        SLOT_MISMATCH,
                        task.id,
                        g,
                        f"task in the line marked {mark!r}",
                        key,
                    )
            elif expected is not None and mark is None:
                where = "ready list" if expected == "@" else "held list"
                if expected in ("@", "~"):
                    detail = f"{task.state} task ({where}) has no mark"
                    self.report(UNMARKED_HEAD, task.id, g, detail, key)
                else:
                    detail = f"{task.state} task has no mark, expected {expected!r}"
                    self.report(SLOT_MISMATCH, task.id, g, detail, key)
            elif expected is not None and mark != expected:
                self.report(
                    SLOT_MISMATCH,
                    task.id,
                    g,
                    f"{task.state} task marked {mark!r}, expected {expected!r}",
                    key,
                )
        for task_id, mark in state.marks.items():
            if task_id not in by_id:
                self.report(
                    STRAY_SLOT, task_id, g, f"mark {mark!r} of no live task of g", key
                )
        if state.halted is not None:
            halting = snap.tasks.get(state.halted)
            if halting is None or halting.state != "dead" or halting.group != g:
                what = "no task" if halting is None else f"a {halting.state} task"
                self.report(STRAY_SLOT, state.halted, g, f"halted behind {what}", key)
        counts = {"k": len(state.marks), "d": first_delay, "w": len(line)}
        for name, want in counts.items():
            have = getattr(state, name) or "0"
            if not _is_int(have) or int(have) != want:
                self.report(
                    BAD_COUNT, None, g, f"{name} is {have!r}, counted {want}", key
                )
        for name in state.other:
            self.report(BAD_COUNT, None, g, f"field {name!r} no script writes", key)
        if g in snap.groups and not (
            state.marks or first_delay or line or state.halted is not None
        ):
            self.report(BAD_COUNT, None, g, "the group's hash is left over empty", key)
        blocked = state.halted is not None or snap.is_paused(g)
        if line and not blocked and len(state.marks) < limit:
            self.report(
                STUCK_PARK,
                None,
                g,
                f"{len(line)} in line behind {len(state.marks)} of {limit} slots taken",
                self.keys.parked(g),
            )
        if held_list and not blocked and g not in wakes:
            self.report(
                STUCK_HELD,
                None,
                g,
                f"{len(held_list)} held back, and the group is not paused, "
                "halted or waiting for its rate",
                self.keys.held(g),
            )

    def expected_mark(
        self, task: Task, ready: set[str], held: set[str], line: set[str]
    ) -> str | None:
        """What the group's mark of *task* should be: '@', '~', 'r', its
        token, "line", "first" (a first delay: no mark), or None (lost or
        misplaced: reported elsewhere)."""
        if task.state == "running":
            return task.token
        if task.state == "delayed":
            # A retry waits out its backoff holding its slot; a task that never
            # started is in its first delay and holds none.
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
        wrong = self.wrong_typed
        with_line = {g: len(ids) for g, ids in snap.parks.items() if ids}
        if snap.keys.backlog not in wrong and (
            {g: int(n) for g, n in snap.backlog.items()} != with_line
        ):
            self.report(
                BAD_COUNT,
                None,
                None,
                "backlog index differs from the lines",
                self.keys.backlog,
            )
        if snap.keys.waiting not in wrong and snap.waiting != set(with_line):
            self.report(
                BAD_COUNT,
                None,
                None,
                "waiting index differs from the lines",
                self.keys.waiting,
            )
        halted = {g for g, s in snap.groups.items() if s.halted is not None}
        if snap.keys.halted not in wrong and snap.halted != halted:
            self.report(
                BAD_COUNT,
                None,
                None,
                "halted index differs from the groups",
                self.keys.halted,
            )
        paused = {g for g in snap.gconf if snap.is_paused(g)}
        if snap.keys.paused not in wrong and snap.paused != paused:
            self.report(
                BAD_COUNT,
                None,
                None,
                "paused index differs from the groups",
                self.keys.paused,
            )
        if snap.keys.stats in wrong:
            return
        counts = {
            "parked": sum(with_line.values()),
            "held": sum(len(ids) for ids in snap.held.values()),
            "ratewait": len(snap.rate_wakes()),
            "groups": len(snap.groups),
        }
        for name, want in counts.items():
            have = snap.stats.get(name, "0")
            if not _is_int(have) or int(have) != want:
                self.report(
                    BAD_COUNT,
                    None,
                    None,
                    f"stats {name} is {have!r}, counted {want}",
                    self.keys.stats,
                )
        for name, value in snap.stats.items():
            if name not in counts and not _is_int(value):
                self.report(
                    BAD_COUNT,
                    None,
                    None,
                    f"stats {name} is {value!r}, not an integer",
                    self.keys.stats,
                )

    def check_conf(self) -> None:
        snap = self.snap
        if snap.keys.conf in self.wrong_typed:
            return
        key = self.keys.conf
        live = [t for t in snap.tasks.values() if t.state in _LIVE]
        prioritised = any(
            _is_int(t.priority) and int(t.priority or 0) > 0 for t in live
        )
        if snap.conf.get("pu") != "1" and (snap.pready or prioritised):
            self.report(
                BAD_CONF,
                None,
                None,
                f"priorities are in use ({len(snap.pready)} in pready) but conf "
                "pu is unset: claims would not look at pready",
                key,
            )
        if snap.conf.get("gc") != "1" and snap.gconf:
            self.report(
                BAD_CONF,
                None,
                None,
                f"{len(snap.gconf)} groups have settings but conf gc is unset: "
                "the scripts ignore them",
                key,
            )
        if snap.conf.get("uq") != "1" and any(t.unique for t in live):
            self.report(
                BAD_CONF,
                None,
                None,
                "tasks hold unique keys but conf uq is unset: their ends "
                "would not free them",
                key,
            )

    def check_fence(self) -> None:
        tokens = [
            (t.id, t.group, int(t.token))
            for t in self.snap.tasks.values()
            if t.token is not None and _is_int(t.token)
        ]
        fence = self.snap.fence
        key = self.keys.fence
        if key in self.wrong_typed:
            return
        if fence is not None and not _is_int(fence):
            self.report(
                BAD_FENCE, None, None, f"fence is {fence!r}, not an integer", key
            )
            return
        if not tokens:
            return
        if fence is None:
            self.report(BAD_FENCE, None, None, "fence is missing but tokens exist", key)
            return
        for task_id, group, token in tokens:
            if token > int(fence):
                self.report(
                    BAD_FENCE,
                    task_id,
                    group,
                    f"token {token} is above the fence counter {fence}",
                    key,
                )


def problems_of(snap: Snapshot) -> list[Problem]:
    """Apply every rule to a snapshot."""
    return _Checker(snap).run()


async def examine(
    client: Client, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[Snapshot, list[Problem]]:
    """Read a queue and apply every rule: the snapshot (``empty`` says
    whether the queue has any key) and its problems."""
    snap = await read(client, keys, max_payload=max_payload)
    return snap, problems_of(snap)


async def check(
    client: Client, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> list[Problem]:
    """Walk one queue's keys and report every broken invariant.

    :param client: any client of the queue's server, with bytes replies
    :param keys: the queue's key names
    :param max_payload: the consumers' payload limit, in bytes
    :return: the problems, sorted by kind, group and task; empty if the queue
        is consistent
    """
    return (await examine(client, keys, max_payload=max_payload))[1]


async def check_queue(
    redis: RedisLike, queue: str, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
) -> list[Problem]:
    """Check one queue's Redis keys and return every broken invariant found.

    An empty list means the queue is consistent (or has no keys at all). The
    reads are not one atomic snapshot: on a busy queue, confirm a problem by
    checking again. A partitioned queue is checked partition by partition,
    then as a whole: each group must be live in one partition only, the one
    the layout gives it.

    :param redis: a ``redis://`` URL or a ``redis.asyncio.Redis`` client
    :param queue: the queue name
    :param max_payload_bytes: the consumers' ``max_payload_bytes``: a live
        task they would refuse as too large is reported ``oversized``
    :raises ConfigurationError: for a bad queue name or client
    :raises RedisUnavailableError: if Redis cannot be reached
    """
    return (await examine_partitions(redis, queue, max_payload=max_payload_bytes))[1]


@unavailable_as_error
async def examine_partitions(
    redis: RedisLike, queue: str, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[list[Snapshot], list[Problem]]:
    """Examine every partition of a queue (one for an unpartitioned queue),
    then the partitions together; the snapshots, and the problems sorted."""
    parts = Partitions(queue)
    async with open_client(redis, retry=True) as client:
        parts.layout = await _layout.read(client, parts)
        snaps: list[Snapshot] = []
        problems: list[Problem] = []
        for keys in parts.all():
            snap, found = await examine(client, keys, max_payload=max_payload)
            snaps.append(snap)
            problems += found
    if parts.partitioned:
        problems += _across(parts, snaps)
    return snaps, sorted(
        set(problems), key=lambda p: (p.kind, p.group or "", p.task_id or "", p.detail)
    )


def _across(parts: Partitions, snaps: list[Snapshot]) -> list[Problem]:
    """What no one partition shows: a group live in the wrong partition or
    in two, and a partition's layout copy that is not partition 0's."""
    found: list[Problem] = []
    layout = parts.layout.text()
    live: dict[str, list[int]] = {}
    for snap in snaps:
        partition = snap.keys.partition
        copy = snap.conf.get("parts", "1")
        if partition and copy != layout and not snap.empty:
            found.append(
                Problem(
                    BAD_LAYOUT,
                    None,
                    None,
                    f"partition {partition} holds layout {copy!r}, partition 0 "
                    f"{layout!r}",
                    snap.keys.conf,
                )
            )
        names = set(snap.groups) | {
            t.group for t in snap.tasks.values() if t.group and t.state in _LIVE
        }
        for name in names:
            live.setdefault(name, []).append(partition)
    for name, where in live.items():
        homes = parts.layout.homes(crc(name))
        if len(where) > 1:
            detail = f"live in partitions {where} at once"
        elif where[0] not in homes:
            detail = f"live in partition {where[0]}, which is not its own {homes}"
        else:
            continue
        found.append(Problem(WRONG_PARTITION, None, name, detail))
    return found


@unavailable_as_error
async def examine_queue(
    redis: RedisLike, keys: QueueKeys, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[Snapshot, list[Problem]]:
    """:func:`examine` with a URL or a client to borrow."""
    async with open_client(redis, retry=True) as client:
        return await examine(client, keys, max_payload=max_payload)


def tally(problems: Iterable[Problem]) -> Counter[str]:
    """How many problems of each kind."""
    return Counter(p.kind for p in problems)
