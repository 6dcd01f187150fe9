"""The rules of the consistency check, by family: the keys themselves, each
task's fields and place, the recovery keys and the dead-letter index, each
group's slots, counts and line, the queue's indexes, ``conf`` flags and
fence, and, for a partitioned queue, what only the partitions together show.

Each rule mirrors what the Lua scripts do (see the headers of
``_lua/lib/*.lua``), not only what they write: a group's settings count only
once the queue's ``conf`` says some group has settings (``gc``), exactly as
``group()`` in ``lib/slots.lua`` reads them, and an envelope is held to the
same limits a consumer holds it to (``_work/runner.py``). The kinds of
problem are in ``_check/problems.py``; ``_check/check.py`` reads a queue
and applies these.
"""

from __future__ import annotations

__all__ = ("LIVE", "find_problems", "problems_across")

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Final

from .._limits import MAX_WEIGHT, STARTS_MOST
from .._store.partition import Partitions, crc
from .._store.schema import WEIGHT, valid_weight
from .problems import (
    BAD_CONF,
    BAD_COUNT,
    BAD_ENVELOPE,
    BAD_FENCE,
    BAD_LAYOUT,
    BAD_SETTING,
    BAD_TASK,
    DUPLICATE,
    GROUP_OVERLAP,
    LOST_TASK,
    MISPLACED,
    NOT_INFLIGHT,
    ORPHAN_ENTRY,
    OVERSIZED,
    SLOT_MISMATCH,
    STALE_STARTS,
    STRAY_SLOT,
    STUCK_HELD,
    STUCK_PARK,
    UNINDEXED_DEAD,
    UNKNOWN_KEY,
    UNMARKED_HEAD,
    WRONG_PARTITION,
    WRONG_SLOT,
    WRONG_TYPE,
    Problem,
    sort_problems,
)
from .snapshot import RATE_WAKE, GroupState, Snapshot, Task, _is_int

#: a weighted group's turns at the ready front in a row, in its state hash
TURN_FIELD: Final = "tn"


def slotless_retries(
    snap: Snapshot, g: str, state: GroupState, tasks: Iterable[Task]
) -> set[str]:
    """The retries of *g* that wait out their backoff holding no slot,
    counted as first delays (d): an exclusive group's. One may outlast a
    change of its group back to strict (it re-joins the line's tail when
    due), which the group's count tells from a lost mark: the count includes
    such retries, and a lost mark leaves it as it was."""
    unmarked = {
        t.id
        for t in tasks
        if t.state == "delayed"
        and _is_int(t.attempt)
        and int(t.attempt or 0) > 0
        and t.id not in state.marks
    }
    if not unmarked or snap.settings(g).get("o") == "exclusive":
        return unmarked
    first = sum(
        1
        for t in tasks
        if t.state == "delayed" and not (_is_int(t.attempt) and int(t.attempt or 0) > 0)
    )
    counted = state.d if state.d is not None and _is_int(state.d) else "0"
    return unmarked if int(counted) == first + len(unmarked) else set()


#: the states of a task that has not ended
LIVE: Final = frozenset({"queued", "delayed", "running"})
TERMINAL: Final = frozenset({"succeeded", "dead", "cancelled", "expired"})
KNOWN_STATES: Final = LIVE | TERMINAL


def find_problems(snap: Snapshot) -> list[Problem]:
    """Apply every rule of one partition to its snapshot; the problems,
    sorted (:func:`~.problems.sort_problems`)."""
    return _Checker(snap).run()


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
            detail = f"{name} is a {kind}"
            if name == self.keys.conf:
                detail += (
                    ", not a hash: the queue's settings and partition layout "
                    "cannot be read, so producers, consumers and views refuse "
                    "the queue (--repair rebuilds it, keeping what is readable)"
                )
            self.report(WRONG_TYPE, None, None, detail, name)
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
        self.check_starts()
        return sort_problems(self.problems)

    def check_starts(self) -> None:
        """A start counter larger than claims keep it: fields they did not
        write, and that no claim sweeps (see ``claim.lua``)."""
        size = self.snap.starts_fields
        if size > STARTS_MOST:
            self.report(
                STALE_STARTS,
                None,
                None,
                f"the start counter holds {size} fields, claims keep at most "
                f"{STARTS_MOST}: the others are stale (--repair deletes them)",
                self.keys.starts,
            )

    # -- tasks --------------------------------------------------------------

    def check_fields(self, task: Task) -> None:
        key = self.keys.task(task.id)
        missing = []
        if task.state not in KNOWN_STATES:
            self.report(
                BAD_TASK, task.id, task.group, f"unknown state {task.state!r}", key
            )
            return
        if task.group == "":
            self.report(BAD_TASK, task.id, None, "empty group field g", key)
        if task.state in LIVE:
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
        if task.state in TERMINAL:
            for label in sorted(set(places)):
                self.report(
                    MISPLACED,
                    task.id,
                    task.group,
                    f"{task.state} task in {label}",
                    self.place_key(label),
                )
            return
        if task.state not in LIVE:
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
            | {t.group for t in snap.tasks.values() if t.group and t.state in LIVE}
        )

    def check_groups(self) -> None:
        snap = self.snap
        live: dict[str, list[Task]] = defaultdict(list)
        for task in snap.tasks.values():
            if task.group and task.state in LIVE:
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
        """Every rule of one group: how many run, each task's slot mark, the
        group's counts, and whether anything will ever move its line."""
        key = self.keys.group(g)
        line = self.snap.parks.get(g, [])
        running = [t for t in tasks if t.state == "running"]
        # More running than its slots allow (a lowered concurrency lets the
        # tasks already holding slots finish).
        if len(running) > max(self.snap.limit(g), len(state.marks)):
            ids = ", ".join(sorted(t.id for t in running))
            self.report(GROUP_OVERLAP, None, g, f"running at once: {ids}", key)
        first_delay = self.check_marks(g, state, tasks, ready, key)
        self.check_group_counts(g, state, first_delay, len(line), key)
        self.check_stuck(g, state, len(line), wakes)

    def check_marks(
        self, g: str, state: GroupState, tasks: list[Task], ready: set[str], key: str
    ) -> int:
        """Each live task's slot mark against where the task is, then the
        marks and the halt marker that name no live task of the group; return
        how many tasks are in their first delay (they hold no slot)."""
        snap = self.snap
        held = set(snap.held.get(g, []))
        in_line = set(snap.parks.get(g, []))
        first_delay = 0
        slotless = slotless_retries(snap, g, state, tasks)
        for task in tasks:
            expected = self.expected_mark(task, ready, held, in_line)
            if expected == "r" and task.id in slotless:
                expected = "first"
            if expected == "first":
                first_delay += 1
            self.check_mark(g, task, state.marks.get(task.id), expected, key)
        live = {t.id for t in tasks}
        for task_id, mark in state.marks.items():
            if task_id not in live:
                self.report(
                    STRAY_SLOT, task_id, g, f"mark {mark!r} of no live task of g", key
                )
        if state.halted is not None:
            halting = snap.tasks.get(state.halted)
            if halting is None or halting.state != "dead" or halting.group != g:
                what = "no task" if halting is None else f"a {halting.state} task"
                self.report(STRAY_SLOT, state.halted, g, f"halted behind {what}", key)
        return first_delay

    def check_mark(
        self, g: str, task: Task, mark: str | None, expected: str | None, key: str
    ) -> None:
        """One task's mark against :meth:`expected_mark`'s answer."""
        if expected in ("first", "line"):
            if mark is not None:
                where = "in its first delay" if expected == "first" else "in the line"
                self.report(
                    SLOT_MISMATCH, task.id, g, f"task {where} marked {mark!r}", key
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

    def check_group_counts(
        self, g: str, state: GroupState, first_delay: int, line: int, key: str
    ) -> None:
        """The group hash's counts (k, d, w) against what was counted, and
        fields or a whole hash that no script would leave."""
        counts = {"k": len(state.marks), "d": first_delay, "w": line}
        for name, want in counts.items():
            have = getattr(state, name) or "0"
            if not _is_int(have) or int(have) != want:
                self.report(
                    BAD_COUNT, None, g, f"{name} is {have!r}, counted {want}", key
                )
        for name in state.other:
            if name == TURN_FIELD:
                continue  # a weighted group's turns (any value: read as 0 if bad)
            self.report(BAD_COUNT, None, g, f"field {name!r} no script writes", key)
        if g in self.snap.groups and not (
            state.marks or first_delay or line or state.halted is not None
        ):
            self.report(BAD_COUNT, None, g, "the group's hash is left over empty", key)

    def check_stuck(
        self, g: str, state: GroupState, line: int, wakes: set[str]
    ) -> None:
        """A line behind a free slot, or heads held back, with nothing that
        would ever move them (no pause, no halt, no rate wake-up)."""
        snap = self.snap
        blocked = state.halted is not None or snap.is_paused(g)
        limit = snap.limit(g)
        if line and not blocked and len(state.marks) < limit:
            self.report(
                STUCK_PARK,
                None,
                g,
                f"{line} in line behind {len(state.marks)} of {limit} slots taken",
                self.keys.parked(g),
            )
        held = len(snap.held.get(g, []))
        if held and not blocked and g not in wakes:
            self.report(
                STUCK_HELD,
                None,
                g,
                f"{held} held back, and the group is not paused, "
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
        live = [t for t in snap.tasks.values() if t.state in LIVE]
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
        self.check_weights()
        if snap.conf.get("uq") != "1" and any(t.unique for t in live):
            self.report(
                BAD_CONF,
                None,
                None,
                "tasks hold unique keys but conf uq is unset: their ends "
                "would not free them",
                key,
            )

    def check_weights(self) -> None:
        """Stored weights (the queue's default, each group's own) and
        orderings that no call of ``Admin`` writes."""
        snap = self.snap
        default = snap.conf.get(WEIGHT)
        if default is not None and not valid_weight(default):
            self.report(
                BAD_SETTING,
                None,
                None,
                f"the queue's default weight is {default!r}, not an integer "
                f"from 1 to {MAX_WEIGHT}: groups run at weight 1",
                self.keys.conf,
            )
        for g, fields in sorted(snap.gconf.items()):
            ordering = fields.get("o")
            if ordering is not None and ordering != "exclusive":
                self.report(
                    BAD_SETTING,
                    None,
                    g,
                    f"ordering is {ordering!r}, not 'exclusive': the group is strict",
                    self.keys.group_conf(g),
                )
            weight = fields.get(WEIGHT)
            if weight is not None and not valid_weight(weight):
                self.report(
                    BAD_SETTING,
                    None,
                    g,
                    f"weight is {weight!r}, not an integer from 1 to "
                    f"{MAX_WEIGHT}: the group runs at the queue's default weight",
                    self.keys.group_conf(g),
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


def problems_across(parts: Partitions, snaps: Sequence[Snapshot]) -> list[Problem]:
    """What no one partition shows: a group live in the wrong partition or
    in two, and a partition's layout copy that is not partition 0's."""
    found: list[Problem] = []
    layout = parts.layout.text()
    live: dict[str, list[int]] = {}
    for snap in snaps:
        partition = snap.keys.partition
        copy = snap.conf.get("parts", "1")
        damaged = snap.damaged_conf is not None  # reported as WRONG_TYPE
        if partition and copy != layout and not snap.empty and not damaged:
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
            t.group for t in snap.tasks.values() if t.group and t.state in LIVE
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
