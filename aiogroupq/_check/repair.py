"""Repair of a queue's keys: ``aiogroupq check --repair`` and :func:`repair_queue`.

A round checks the queue (:mod:`.check`), picks the first stage that has
problems and runs its steps, each one ``repair.lua`` call; then the queue is
checked again, until it is consistent or nothing more can be done. The
stages go from the keys outwards, so that each one works on what the earlier
ones left sound:

1. *keys*: a key of the wrong type, or one no script makes, is deleted; what
   it held shows up in the next check as lost tasks or damaged counts. The
   queue's ``conf`` is rebuilt instead, keeping what is readable of its
   settings and layout (``_check/conf_rebuild.py``);
2. *tasks*: a live task whose hash is damaged (missing fields, an envelope
   that does not decode or is too large, an unknown state) is dead-lettered
   with a ``Corrupt:`` reason, out of wherever it waits, its slot passed on;
3. *flags*: a ``conf`` flag the scripts rely on is set again, a bad stored
   weight or ordering removed;
4. *places*: each task with a wrong, doubled or missing entry gets exactly
   one, where its state says (a lost task of a group's line goes back at its
   place, by the time it became runnable and then its id; a running one gets
   an expired lease, so the next claim recovers it as after a crash);
5. *groups*: a group's slot marks are rebuilt from its tasks' states, its
   counts from its keys, then its free slots filled as the scripts would;
6. *counters*: indexes, gauges of the stats hash and the fence counter.

Each step reads again, inside its script, what it changes and decides from
that, not from the check's reading: a step made needless by the queue
moving on changes nothing, and running the repair twice is harmless. Group
order is kept: a task going back to a group goes where the group's order
puts it, and free slots are filled from the front of the line.
"""

from __future__ import annotations

__all__ = ("ROUNDS", "Repair", "repair", "repair_queue")

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import ResponseError

from .._limits import DEFAULT_MAX_PAYLOAD_BYTES
from .._store import layout as _layout
from .._store.connection import RedisLike, open_client
from .._store.failures import unavailable_as_error
from .._store.partition import Layout, Partitions
from .._store.scripts import REPAIR
from ..errors import CorruptQueueError
from . import check as _check, problems as _problems, snapshot as _snapshot
from .conf_rebuild import conf_step
from .rules import slotless_retries
from .starts import clear_stale_starts

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .._store.connection import Client
    from .._store.keys import QueueKeys

#: most check-and-repair rounds of one repair
ROUNDS: Final = 12
#: groups per "index" step
_PER_STEP: Final = 200

_LIVE: Final = frozenset({"queued", "delayed", "running"})

# Which stage repairs each kind of problem; WRONG_SLOT has none (the key's
# name is wrong, which only a rename by hand can fix).
_STAGES: Final = (
    ("keys", frozenset({_problems.WRONG_TYPE, _problems.UNKNOWN_KEY})),
    (
        "tasks",
        frozenset(
            {
                _problems.BAD_TASK,
                _problems.BAD_ENVELOPE,
                _problems.OVERSIZED,
            }
        ),
    ),
    ("flags", frozenset({_problems.BAD_CONF, _problems.BAD_SETTING})),
    (
        "places",
        frozenset(
            {
                _problems.ORPHAN_ENTRY,
                _problems.MISPLACED,
                _problems.DUPLICATE,
                _problems.LOST_TASK,
                _problems.NOT_INFLIGHT,
                _problems.UNINDEXED_DEAD,
            }
        ),
    ),
    (
        "groups",
        frozenset(
            {
                _problems.SLOT_MISMATCH,
                _problems.STRAY_SLOT,
                _problems.UNMARKED_HEAD,
                _problems.STUCK_PARK,
                _problems.STUCK_HELD,
                _problems.GROUP_OVERLAP,
            }
        ),
    ),
    ("counters", frozenset({_problems.BAD_COUNT, _problems.BAD_FENCE})),
    # The start counter's stale fields: deleted in slices (not repair.lua's).
    ("starts", frozenset({_problems.STALE_STARTS})),
)


@dataclass(frozen=True, slots=True)
class Repair:
    """One change :func:`repair_queue` made.

    :ivar step: what kind of change: ``"drop"`` (a damaged or unknown key
        deleted), ``"conf"`` (the queue's damaged ``conf`` rebuilt),
        ``"bury"`` (a damaged task dead-lettered), ``"flag"`` (a conf flag
        set), ``"place"`` (a task's entries put right), ``"group"`` (a
        group's marks and counts rebuilt), ``"index"``, ``"stat"`` or
        ``"fence"`` (a count set), ``"starts"`` (the start counter's stale
        fields deleted)
    :ivar task_id: the task concerned, if one is
    :ivar group: the group concerned, if one is
    :ivar detail: what was changed, in words
    """

    step: str
    task_id: str | None
    group: str | None
    detail: str

    def __str__(self) -> str:
        where = "".join(
            f" {label} {value!r}"
            for label, value in (("task", self.task_id), ("group", self.group))
            if value is not None
        )
        return f"{self.step}{where}: {self.detail}"


@dataclass(frozen=True, slots=True)
class _Step:
    args: tuple[EncodableT, ...]
    task_id: str | None = None
    group: str | None = None


def _stage_of(problem: _problems.Problem) -> str | None:
    if problem.kind == _problems.BAD_COUNT and problem.group is not None:
        return "groups"  # a group's own counts: rebuilt with its marks
    for name, kinds in _STAGES:
        if problem.kind in kinds:
            return name
    return None


def _order(snap: _snapshot.Snapshot, task_id: str) -> tuple[int, str]:
    """Where a task belongs in its group's line: by the time it became
    runnable (server ms), then by id (ids are time-ordered)."""
    task = snap.tasks.get(task_id)
    due = task.due if task is not None else None
    return (int(due) if due is not None and _snapshot._is_int(due) else 0, task_id)


def _pivots(
    snap: _snapshot.Snapshot, group: str, ids: Iterable[str], heads: Iterable[str] = ()
) -> dict[str, str]:
    """For each task going back into *group*'s line, the entry to insert it
    before ("" for the tail).

    *heads* held a slot before (an entry of the ready or held list, a task
    that has started): a slot holder is ahead of every task of the line, so
    these go first, oldest first. The others go before the first entry that
    became runnable after them. Both are inserted oldest first, so several
    of them keep their order among themselves too.
    """
    first = set(heads)
    moving = set(ids) | first
    line = [i for i in snap.parks.get(group, []) if i not in moving]
    out = {}
    for n, task_id in enumerate(sorted(first, key=lambda i: _order(snap, i))):
        out[task_id] = line[n] if n < len(line) else ""
        line.insert(n, task_id)
    for task_id in sorted(moving - first, key=lambda i: _order(snap, i)):
        key = _order(snap, task_id)
        at = next(
            (
                n
                for n, other in enumerate(line[len(first) :], len(first))
                if _order(snap, other) > key
            ),
            None,
        )
        out[task_id] = "" if at is None else line[at]
        line.insert(len(line) if at is None else at, task_id)
    return out


def _started(snap: _snapshot.Snapshot, task_id: str) -> bool:
    task = snap.tasks.get(task_id)
    return (
        task is not None
        and _snapshot._is_int(task.attempt)
        and int(task.attempt or 0) > 0
    )


def _places(snap: _snapshot.Snapshot) -> dict[str, list[str]]:
    """Every place label each id has an entry in."""
    places: dict[str, list[str]] = defaultdict(list)
    for label, ids in (
        ("ready", snap.ready),
        ("pready", snap.pready),
        ("delayed", snap.delayed),
        ("leases", snap.leases),
        ("dead", snap.dead),
    ):
        for task_id in ids:
            places[task_id].append(label)
    for family, lists in (
        ("park", snap.parks),
        ("held", snap.held),
        ("inflight", snap.inflight),
    ):
        for item, ids in lists.items():
            for task_id in ids:
                places[task_id].append(f"{family}:{item}")
    return places


def _expected_type(keys: QueueKeys, name: str) -> str:
    """The type a key of the queue must have; "" for a key no script makes."""
    rest = name.removeprefix(keys.prefix)
    if rest in _snapshot.FIXED:
        return _snapshot.FIXED[rest]
    family, sep, item = rest.partition(":")
    if sep and item and family in _snapshot.FAMILIES:
        return _snapshot.FAMILIES[family]
    return ""


def _plan_keys(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    steps = []
    for p in problems:
        if p.key is None or p.key == snap.keys.conf:  # see _conf_steps
            continue
        step: tuple[EncodableT, ...] = ("drop", p.key, _expected_type(snap.keys, p.key))
        if p.key == snap.keys.fence:  # set again in the same call: see repair.lua
            step += (_highest_token(snap),)
        steps.append(_Step(step))
    return steps


def _highest_token(snap: _snapshot.Snapshot) -> int:
    """The highest fencing token a task of *snap* holds."""
    return max(
        (int(t.token or 0) for t in snap.tasks.values() if _snapshot._is_int(t.token)),
        default=0,
    )


async def _conf_steps(
    client: Client,
    snap: _snapshot.Snapshot,
    problems: Sequence[_problems.Problem],
    layout: Layout | None,
) -> list[_Step]:
    """The step rebuilding a damaged ``conf``, which a drop would lose the
    settings and layout of (*layout*: the queue's, None to read it)."""
    keys = snap.keys
    if snap.damaged_conf is None or all(p.key != keys.conf for p in problems):
        return []
    if layout is None:
        layout = await _layout.read_or_recover(client, Partitions(keys.queue))
    return [_Step(await conf_step(client, keys, snap, layout))]


def _plan_tasks(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    whys: dict[str, list[str]] = defaultdict(list)
    for p in problems:
        if p.task_id is None:
            continue
        if p.kind == _problems.BAD_ENVELOPE:
            whys[p.task_id].append(f"its envelope does not decode ({p.detail})")
        elif p.kind == _problems.OVERSIZED:
            whys[p.task_id].append(f"it is too large ({p.detail})")
        else:
            whys[p.task_id].append(f"its hash is damaged ({p.detail})")
    places = _places(snap)
    steps = []
    for task_id, why in sorted(whys.items()):
        task = snap.tasks.get(task_id)
        if task is None:
            continue
        labels = sorted(set(places.get(task_id, [])))
        args = ("bury", task_id, task.state or "", "; ".join(why), *labels)
        steps.append(_Step(args, task_id, task.group))
    return steps


def _plan_flags(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    live = [t for t in snap.tasks.values() if t.state in _LIVE]
    flags = []
    if snap.pready or any(
        _snapshot._is_int(t.priority) and int(t.priority or 0) > 0 for t in live
    ):
        flags.append("pu")
    if snap.gconf:
        flags.append("gc")
    if any(t.unique for t in live):
        flags.append("uq")
    steps = [_Step(("flag", name)) for name in flags if snap.conf.get(name) != "1"]
    # A bad stored weight or ordering goes: the default applies.
    steps.extend(
        _Step(("setting", p.group or ""), None, p.group)
        for p in problems
        if p.kind == _problems.BAD_SETTING
    )
    return steps


def _plan_places(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    ids = sorted({p.task_id for p in problems if p.task_id is not None})
    places = _places(snap)
    # Lost tasks of a group's line go back at their place in it.
    lost: dict[str, list[str]] = defaultdict(list)
    for task_id in ids:
        task = snap.tasks.get(task_id)
        waits = [
            label
            for label in places.get(task_id, [])
            if not label.startswith(("inflight:", "dead"))
        ]
        twice = task is not None and waits.count(f"park:{task.group}") > 1
        if (
            task is not None
            and task.state == "queued"
            and task.group
            and (not waits or twice)
            and task_id not in snap.groups.get(task.group, _snapshot.GroupState()).marks
        ):
            # Lost, or twice in its line (then one entry goes back at its
            # place, as a lost one would).
            lost[task.group].append(task_id)
    pivots: dict[str, str] = {}
    for group, members in lost.items():
        started = [i for i in members if _started(snap, i)]
        pivots.update(_pivots(snap, group, members, started))
    steps = []
    for task_id in sorted(ids, key=lambda i: _order(snap, i)):
        task = snap.tasks.get(task_id)
        labels = sorted(places.get(task_id, []))  # twice in a list: twice here
        args = ("place", task_id, pivots.get(task_id, ""), *labels)
        steps.append(_Step(args, task_id, task.group if task else None))
    return steps


def _plan_groups(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    fixes: dict[str, set[str]] = defaultdict(set)
    for p in problems:
        if p.group is None:
            continue
        fixes.setdefault(p.group, set())
        if p.task_id is not None and p.kind in (
            _problems.SLOT_MISMATCH,
            _problems.UNMARKED_HEAD,
        ):
            fixes[p.group].add(p.task_id)
    ready = set(snap.ready) | set(snap.pready)
    steps = []
    for group, ids in sorted(fixes.items()):
        state = snap.groups.get(group, _snapshot.GroupState())
        # Retries holding no slot (an exclusive group's) count as first
        # delays, as the check counts them.
        tasks = [t for t in snap.tasks.values() if t.group == group]
        slotless = slotless_retries(snap, group, state, tasks)
        first_delay = sum(
            1
            for t in tasks
            if t.state == "delayed"
            and (
                not (_snapshot._is_int(t.attempt) and int(t.attempt or 0) > 0)
                or t.id in slotless
            )
        )
        held = set(snap.held.get(group, []))
        moving = [i for i in ids if i not in state.marks and (i in ready or i in held)]
        pivots = _pivots(snap, group, (), moving)
        args: list[EncodableT] = ["group", group, state.d or "", first_delay]
        for task_id in sorted(ids, key=lambda i: _order(snap, i)):
            args += [task_id, pivots.get(task_id, "")]
        steps.append(_Step(tuple(args), None, group))
    return steps


def _plan_counters(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    steps = []
    kinds = {p.kind for p in problems}
    if _problems.BAD_COUNT in kinds:
        with_line = {g: len(ids) for g, ids in snap.parks.items() if ids}
        halted = {g for g, s in snap.groups.items() if s.halted is not None}
        paused = {g for g, conf in snap.gconf.items() if conf.get("p") == "1"}
        backlog = {g: int(n) for g, n in snap.backlog.items()}
        names = sorted(
            {g for g, _ in set(backlog.items()) ^ set(with_line.items())}
            | (snap.waiting ^ set(with_line))
            | (snap.halted ^ halted)
            | (snap.paused ^ paused)
        )
        steps += [
            _Step(("index", *names[start : start + _PER_STEP]))
            for start in range(0, len(names), _PER_STEP)
        ]
        gauges = {
            "parked": sum(with_line.values()),
            "held": sum(len(ids) for ids in snap.held.values()),
            "ratewait": len(snap.rate_wakes()),
            "groups": len(snap.groups),
        }
        for name, value in sorted(snap.stats.items()):
            if name not in gauges and not _snapshot._is_int(value):
                steps.append(_Step(("stat", name, 0, value)))
        for name, want in gauges.items():
            have = snap.stats.get(name)
            if have is None and want == 0:
                continue
            if have is None or not _snapshot._is_int(have) or int(have) != want:
                steps.append(_Step(("stat", name, want, have or "")))
    if _problems.BAD_FENCE in kinds:
        steps.append(_Step(("fence", _highest_token(snap))))
    return steps


def _plan_starts(
    snap: _snapshot.Snapshot, problems: Sequence[_problems.Problem]
) -> list[_Step]:
    """One step whatever the problems: see :func:`_run_step`."""
    return [_Step(("starts",))]


_PLANS: Final = {
    "keys": _plan_keys,
    "tasks": _plan_tasks,
    "flags": _plan_flags,
    "places": _plan_places,
    "groups": _plan_groups,
    "counters": _plan_counters,
    "starts": _plan_starts,
}


async def _run_step(client: Client, keys: QueueKeys, step: _Step) -> str:
    """Run one step; "" when it changed nothing (or could not run yet)."""
    if step.args[0] == "starts":  # many fields: HSCAN and HDEL slices, no script
        return await clear_stale_starts(client, keys.starts)
    # Ids and names as stored, even when they are not UTF-8.
    args = [
        a.encode("utf-8", "surrogateescape") if isinstance(a, str) else a
        for a in step.args
    ]
    try:
        reply: Any = await REPAIR(client, keys, (), args)
    except CorruptQueueError:
        return ""  # a key it writes is damaged: the "keys" stage comes first
    text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
    return "" if text == "retry" else text


async def _activity(client: Client, keys: QueueKeys) -> Any:
    """The stats hash: any enqueue, start, end or group change moves it."""
    try:
        return await client.hgetall(keys.stats)
    except ResponseError:  # a damaged stats key: the keys stage deals with it
        return None


async def repair(
    client: Client,
    keys: QueueKeys,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
    rounds: int = ROUNDS,
    layout: Layout | None = None,
) -> tuple[list[Repair], list[_problems.Problem]]:
    """Check and repair one queue until it is consistent or nothing more can
    be done; return the changes made and the problems left.

    :param layout: the queue's partition layout, for rebuilding a damaged
        ``conf`` (None: read it when needed)
    """
    done: list[Repair] = []
    stuck: set[str] = set()  # stages whose steps changed nothing
    problems: list[_problems.Problem] = []
    for _ in range(rounds):
        before = await _activity(client, keys)
        found = await _check.examine(client, keys, max_payload=max_payload)
        (snap,), problems = found.snapshots, found.problems
        # Counters are recounted from the snapshot, which is not one atomic
        # read: only when nothing moved while it was taken.
        quiet = before == await _activity(client, keys)
        by_stage: dict[str, list[_problems.Problem]] = defaultdict(list)
        for p in problems:
            stage = _stage_of(p)
            if stage is not None and (stage != "counters" or quiet):
                by_stage[stage].append(p)
        todo = [name for name, _ in _STAGES if by_stage[name] and name not in stuck]
        if not todo:
            break
        stage = todo[0]
        changed = False
        steps = _PLANS[stage](snap, by_stage[stage])
        if stage == "keys":
            steps += await _conf_steps(client, snap, by_stage[stage], layout)
        for step in steps:
            detail = await _run_step(client, keys, step)
            if detail:
                changed = True
                done.append(Repair(str(step.args[0]), step.task_id, step.group, detail))
        if changed:
            stuck.clear()
        else:
            stuck.add(stage)
    else:
        problems = (
            await _check.examine(client, keys, max_payload=max_payload)
        ).problems
    return done, problems


async def repair_queue(
    redis: RedisLike,
    queue: str,
    *,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> list[Repair]:
    """Repair what :func:`check_queue` finds in one queue's Redis keys.

    Each kind of problem is repaired so that group order is kept: damaged
    or unknown keys are deleted (a damaged ``conf`` is rebuilt, keeping the
    settings and partition layout still readable), tasks whose hash is damaged are
    dead-lettered (``Corrupt: ...``), each task gets exactly the one entry
    its state calls for (a lost one goes back where its group's order puts
    it; a running one whose lease is gone is recovered by the next claim,
    as after a crash), groups' marks and counts are rebuilt from their
    tasks, and indexes, counters and the fence are recounted. Every step is
    atomic and checks again what it changes, so the repair is safe on a
    live queue and may be run again. Call :func:`check_queue` afterwards to
    see what is left (a key in another cluster slot is never moved).

    :param redis: a ``redis://`` URL or a ``redis.asyncio.Redis`` client
    :param queue: the queue name
    :param max_payload_bytes: the consumers' ``max_payload_bytes``: a live
        task they would refuse as too large is dead-lettered
    :return: the changes made, in order
    :raises ConfigurationError: for a bad queue name or client
    :raises RedisUnavailableError: if Redis cannot be reached
    """
    return (await repair_partitions(redis, queue, max_payload=max_payload_bytes))[0]


@unavailable_as_error
async def repair_partitions(
    redis: RedisLike, queue: str, *, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[list[Repair], list[_problems.Problem]]:
    """:func:`repair` of every partition of a queue; the changes, and what
    the check finds afterwards (a group live in the wrong partition is only
    reported: moving tasks between partitions would break its order)."""
    parts = Partitions(queue)
    done: list[Repair] = []
    async with open_client(redis, retry=True) as client:
        parts.layout = await _layout.read_or_recover(client, parts)
        for keys in parts.all():
            done += (
                await repair(client, keys, max_payload=max_payload, layout=parts.layout)
            )[0]
    found = await _check.examine(redis, queue, max_payload=max_payload)
    return done, found.problems


@unavailable_as_error
async def repair_keys(
    redis: RedisLike,
    keys: QueueKeys,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> tuple[list[Repair], list[_problems.Problem]]:
    """:func:`repair` with a URL or a client to borrow."""
    async with open_client(redis, retry=True) as client:
        return await repair(client, keys, max_payload=max_payload)
