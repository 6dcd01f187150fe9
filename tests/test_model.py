"""Model-based test: random sequences of script calls against an exact model.

Hypothesis drives the scripts (enqueue, claim, finish, heartbeat, cancel,
dead-letter requeue and release, group settings, pause and resume) with
random groups, delays, priorities, expiries, dedup keys, outcomes, re-sent
calls, lease expiries and cancellations. A Python model keeps the whole
queue: each group's order (its slot holders first, then its line), its
concurrency, pause, halt and rate window, the ready list and the priority
set in the order the scripts must keep them, and each task's state, attempt
and token. So the model predicts every claim exactly (which tasks, in which
order), and thereby checks:

* group order: a group's tasks take slots, and start, in enqueue order
  (retried and recovered tasks keep theirs: a later task never overtakes),
  except in an exclusive group (ordering "exclusive"), where a retry waiting
  out its backoff gives its slot on and re-joins the tail of the group's
  line when due: there the model predicts that order instead, and only
  exclusion is a guarantee;
* group concurrency: a group never runs more tasks at once than its slots,
  and with concurrency 1 never two (exclusion);
* round-robin fairness: a released group's next task joins the ready tail,
  behind every group already waiting (or the front with fairness "drain");
* weights: a group of weight w keeps the ready front for w turns in a row,
  then goes to the tail (its turn counter, kept in its hash, checked too);
* priorities: a higher-priority head is claimed first, FIFO within a level;
* paused and halted groups start nothing, rate-limited groups no more than
  their rate, expired tasks never;
* no head-of-line blocking: a claim that returns fewer than k tasks leaves
  nothing runnable behind.

After every step ``_fsck.examine`` must find nothing and the keys must equal
the model.

Time is simulated, so that a run is deterministic (hypothesis replays and
shrinks it). Claims use a lease nobody outlives; the ``expire`` rule sets a
running task's lease score to 0, which the next claim recovers as it would a
lease whose consumer died. Delays, retry backoffs and rate windows are a day
long; each claim first advances a virtual clock and rewrites the score of
each delayed member that falls due (a task, or a rate-limited group's
"~<group>" wake-up) to its virtual due time, a small number in the server's
past, and a free rate window's start times to 0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import hypothesis.strategies as st
import pytest
import redis.asyncio
from hypothesis import event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from aiogroupq._check import check as _fsck
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.replies import CancelCode, FinishCode

from ._tasks import envelope_of

T = TypeVar("T")

KEYS: Final = QueueKeys("model")
#: claims' lease: never expires by itself during a run (expiry is simulated)
LEASE_MS: Final = 600_000
#: delays, backoffs and rate windows: never over by themselves (simulated)
FAR_MS: Final = 86_400_000
RETENTION_MS: Final = 600_000
WINDOW_MS: Final = 600_000
GROUPS: Final = ("g1", "g2", "g3")
CONSUMERS: Final = ("c1", "c2")
#: virtual ms a rate window lasts
RATE_MS: Final = 30

#: the server of the running test, for the machine (hypothesis builds it)
_SERVER: dict[str, str] = {}

#: (group, delay in virtual ms, max_attempts, dedup key, priority, expired)
TaskSpec = tuple[str | None, int, int, str | None, int, bool]
task_specs = st.tuples(
    st.sampled_from([None, *GROUPS, *GROUPS]),
    st.sampled_from([0, 0, 0, 1, 5, 20]),
    st.integers(1, 3),
    st.sampled_from([None, None, None, None, "k1", "k2"]),
    st.sampled_from([0, 0, 0, 0, 5, 9]),
    st.sampled_from([False, False, False, False, True]),
)


@dataclass
class ModelTask:
    """What the model knows of one task."""

    id: str
    group: str | None
    envelope: bytes
    max_attempts: int
    priority: int
    expiring: bool  # enqueued with an expiry time already past
    #: queued | delayed | running | succeeded | dead | cancelled | expired
    state: str
    #: in its group's order; False only while its first delay runs
    joined: bool
    attempt: int = 0
    token: int | None = None
    #: the lease was set into the past and no claim has recovered it yet
    expired_lease: bool = False
    #: token of the last finish applied, which a re-sent finish repeats
    finished_with: int | None = None
    #: virtual due time while delayed
    due: int | None = None
    #: its delayed score was rewritten to ``due``: the next claim promotes it
    due_now: bool = False
    #: cancelled while running: it must not run again
    cancel_requested: bool = False
    #: a slot holder held back (paused, halted or out of its rate)
    held: bool = False


@dataclass
class ModelGroup:
    """What the model knows of one group."""

    #: joined, unended tasks: the slot holders first, then the line
    order: list[str] = field(default_factory=list)
    slots: int = 0
    limit: int = 1
    paused: bool = False
    halted: str | None = None
    rate: bool = False  # one start per window of RATE_MS virtual ms
    window_until: int | None = None  # the current window's end
    window_cleared: bool = True  # its start times were rewritten to the past
    wake_due: int | None = None  # a "~<group>" wake-up is pending
    wake_now: bool = False
    held: list[str] = field(default_factory=list)
    weight: int = 1
    #: ordering "exclusive": a retry's backoff holds no slot
    exclusive: bool = False
    #: turns at the ready front in a row (only counted while weight > 1)
    turns: int = 0
    #: the scripts have read the counter since the group's hash was made
    turns_stored: bool = False


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class QueueMachine(RuleBasedStateMachine):
    """One queue, one model, one private event loop and connection."""

    def __init__(self) -> None:
        super().__init__()
        # Rules are sync; each runs its coroutines to completion on this
        # machine's own loop, which owns the connection for the whole run.
        self.runner = asyncio.Runner()
        self.client = redis.asyncio.Redis.from_url(_SERVER["url"])
        self.run(self.client.flushdb())
        self.tasks: dict[str, ModelTask] = {}
        self.groups: dict[str, ModelGroup] = {g: ModelGroup() for g in GROUPS}
        self.ready: list[str] = []  # the ready list, front first
        #: the priority set, as (score key, id); the smallest key is next
        self.pready: list[tuple[tuple[int, int], str]] = []
        self.prio_on = False
        self.seq = 0  # relative order of pready pushes
        self.drain = False
        self.dedup: dict[str, str] = {}
        self.sent: list[tuple[list[_scripts.NewTask], list[str]]] = []
        self.stale: list[tuple[str, int]] = []  # tokens that own nothing now
        self.max_token = 0
        self.next_id = 0
        self.now = 0  # the virtual clock, in ms

    def run(self, awaitable: Awaitable[T]) -> T:
        """Run *awaitable* on this machine's loop."""

        async def wrapper() -> T:
            return await awaitable

        coro: Coroutine[Any, Any, T] = wrapper()
        return self.runner.run(coro)

    def teardown(self) -> None:
        try:
            self.run(self.client.aclose())
        finally:
            self.runner.close()

    # -- the model's mechanics (mirror lib/ready.lua and lib/groups.lua) ------

    def running(self) -> list[str]:
        """Ids of the running tasks, sorted (draws must not depend on hashing)."""
        return sorted(i for i, t in self.tasks.items() if t.state == "running")

    def level(self, task: ModelTask) -> int:
        """The level a task waits at (a group with several heads: its own 0)."""
        if task.group is not None and self.groups[task.group].limit > 1:
            return 0
        return task.priority

    def push(self, task_id: str, *, front: bool) -> None:
        if not self.prio_on:
            if front:
                self.ready.insert(0, task_id)
            else:
                self.ready.append(task_id)
            return
        self.seq += 1
        level = self.level(self.tasks[task_id])
        self.pready.append(((9 - level, -self.seq if front else self.seq), task_id))
        self.pready.sort()

    def pop(self) -> str | None:
        """The list's tasks (from before priorities) go after the higher
        levels of the priority set and before its level 0."""
        if self.pready and (not self.ready or self.pready[0][0][0] < 9):
            return self.pready.pop(0)[1]
        return self.ready.pop(0) if self.ready else None

    def remove_ready(self, task_id: str) -> None:
        self.pready = [e for e in self.pready if e[1] != task_id]
        if task_id in self.ready:
            self.ready.remove(task_id)

    def has_room(self, g: ModelGroup) -> bool:
        return (
            not g.paused
            and g.halted is None
            and g.slots < g.limit
            and len(g.order) == g.slots
        )

    def front_turn(self, g: ModelGroup) -> bool:
        """Whether a released group's next task goes to the front (mirrors
        front_turn in lib/groups.lua)."""
        if self.drain:
            return True
        if g.weight <= 1:
            return False
        g.turns += 1
        g.turns_stored = True
        if g.turns < g.weight:
            event("weight: a turn at the front")
            return True
        g.turns = 0
        return False

    def fill(self, g: ModelGroup) -> None:
        while (
            not g.paused
            and g.halted is None
            and g.slots < g.limit
            and len(g.order) > g.slots
        ):
            self.push(g.order[g.slots], front=self.front_turn(g))
            g.slots += 1

    def route(self, task: ModelTask) -> None:
        """A task joins its group (or the ready tail, ungrouped)."""
        task.joined = True
        if task.group is None:
            self.push(task.id, front=False)
            return
        g = self.groups[task.group]
        if self.has_room(g):
            g.slots += 1
            self.push(task.id, front=False)
        g.order.append(task.id)

    def leave(self, task: ModelTask, *, halt: bool = False) -> None:
        """*task*, a slot holder, is done for good: its slot passes on."""
        if task.group is None:
            return
        g = self.groups[task.group]
        index = g.order.index(task.id)
        assert index < g.slots, (task, g)
        g.order.pop(index)
        g.slots -= 1
        if halt:
            g.halted = task.id
        else:
            self.fill(g)

    def unshelve(self, g: ModelGroup) -> None:
        if g.paused or g.halted is not None:
            return
        for task_id in reversed(g.held):
            self.tasks[task_id].held = False
            self.push(task_id, front=True)
        g.held.clear()
        self.fill(g)

    def retire(self, task: ModelTask) -> None:
        """The current token stops owning the task."""
        assert task.token is not None
        self.stale.append((task.id, task.token))
        task.expired_lease = False

    # -- rules ---------------------------------------------------------------

    @initialize(specs=st.lists(task_specs, min_size=3, max_size=10))
    def backlog(self, specs: list[TaskSpec]) -> None:
        """Start with a backlog, so that even short runs have work to claim."""
        self.enqueue_batch(specs)

    @initialize(
        weights=st.lists(st.sampled_from([1, 2, 2, 3]), min_size=3, max_size=3),
        exclusive=st.lists(st.booleans(), min_size=3, max_size=3),
    )
    def weigh(self, weights: list[int], exclusive: list[bool]) -> None:
        """Start with weighted and exclusive groups, so that runs reach their
        turns' ends and retries in exclusive groups."""
        for name, weight, excl in zip(GROUPS, weights, exclusive, strict=True):
            if weight > 1 or excl:
                self.set_group(name, 1, False, weight, excl)

    @rule(spec=task_specs)
    def enqueue(self, spec: TaskSpec) -> None:
        """Enqueue one task."""
        self.enqueue_batch([spec])

    @rule(specs=st.lists(task_specs, min_size=2, max_size=5))
    def enqueue_many(self, specs: list[TaskSpec]) -> None:
        """Enqueue a batch atomically; a group keeps the batch's order."""
        self.enqueue_batch(specs)

    def enqueue_batch(self, specs: list[TaskSpec]) -> None:
        """Send *specs* as one call; check the ids (deduplication), model them."""
        batch: list[_scripts.NewTask] = []
        expected: list[str] = []
        created: list[tuple[_scripts.NewTask, int, int, bool]] = []
        for group, delay_ms, max_attempts, dedup, priority, expiring in specs:
            task_id = f"t{self.next_id:04d}"
            self.next_id += 1
            batch.append(
                _scripts.NewTask(
                    id=task_id,
                    group=group,
                    envelope=envelope_of(task_id, group),
                    delay_ms=FAR_MS if delay_ms else 0,
                    max_attempts=max_attempts,
                    dedup_key=dedup,
                    priority=priority,
                    expire_at_ms=1 if expiring else 0,
                )
            )
            if dedup is not None and dedup in self.dedup:
                expected.append(self.dedup[dedup])  # deduplicated: not created
                continue
            if dedup is not None:
                self.dedup[dedup] = task_id
            expected.append(task_id)
            created.append((batch[-1], delay_ms, priority, expiring))
        ids = self.run(
            _scripts.enqueue(self.client, KEYS, batch, dedup_window_ms=WINDOW_MS)
        )
        assert ids == expected
        self.sent.append((batch, ids))
        if any(c[2] for c in created):
            self.prio_on = True
        for new, delay_ms, priority, expiring in created:
            task = ModelTask(
                new.id,
                new.group,
                new.envelope,
                new.max_attempts,
                priority,
                expiring,
                state="delayed" if delay_ms > 0 else "queued",
                joined=False,
                due=self.now + delay_ms if delay_ms > 0 else None,
            )
            self.tasks[new.id] = task
            if delay_ms == 0:
                self.route(task)

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def resend_enqueue(self, data: st.DataObject) -> None:
        """A lost reply: the same batch again returns the same ids, adds nothing."""
        batch, ids = data.draw(st.sampled_from(self.sent))
        again = self.run(
            _scripts.enqueue(self.client, KEYS, batch, dedup_window_ms=WINDOW_MS)
        )
        assert again == ids

    @rule(
        k=st.integers(1, 4),
        consumer=st.sampled_from(CONSUMERS),
        elapsed=st.sampled_from([0, 0, 1, 5, 25, 40]),
    )
    def claim(self, k: int, consumer: str, elapsed: int) -> None:
        """*elapsed* virtual ms pass, then a claim (which recovers, promotes)."""
        self.tick(elapsed)
        reply = self.run(
            _scripts.claim(
                self.client, KEYS, consumer, k=k, lease_ms=LEASE_MS, scan_limit=1000
            )
        )
        # (a) Every expired lease is recovered, before anything is claimed.
        assert list(reply.dead) == self.recover_expired()
        # (b) What falls due is promoted in due order (ties: by member).
        self.promote_due()
        # (c) Claim from the front, exactly as the model's lists say.
        expected = self.claim_from_front(k)
        self.check_claimed(reply, k, expected)

    def recover_expired(self) -> list[str]:
        """The model of a claim's recovery; the ids it dead-letters."""
        dead: list[str] = []
        for task_id in self.running():
            task = self.tasks[task_id]
            if not task.expired_lease:
                continue
            self.retire(task)
            if task.cancel_requested:
                event("recovery: cancelled")
                task.state = "cancelled"
                self.leave(task)
            elif task.attempt >= task.max_attempts:
                event("recovery: dead-lettered")
                task.state = "dead"
                dead.append(task.id)
                self.leave(task)
            else:
                event("recovery: requeued")
                task.state = "queued"  # keeps its slot, at the front
                self.push(task.id, front=True)
        return dead

    def promote_due(self) -> None:
        """The model of a claim's promotion of due tasks and rate wake-ups."""
        due: list[tuple[int, str]] = [
            (t.due or 0, t.id)
            for t in self.tasks.values()
            if t.state == "delayed" and t.due_now
        ]
        due += [
            (g.wake_due or 0, "~" + name)
            for name, g in self.groups.items()
            if g.wake_now
        ]
        for _, member in sorted(due):
            if member.startswith("~"):
                event("promoted: rate wake-up")
                g = self.groups[member[1:]]
                g.wake_due, g.wake_now = None, False
                self.unshelve(g)
                continue
            task = self.tasks[member]
            task.due, task.due_now = None, False
            if task.joined and task.group is not None:
                event("promoted: retry")  # its group waited for it
                task.state = "queued"
                self.push(task.id, front=True)
            elif task.joined:
                event("promoted: ungrouped retry")  # like any due task
                task.state = "queued"
                self.push(task.id, front=False)
            elif task.expiring and task.attempt == 0:
                event("promoted: expired")
                task.state = "expired"
            else:
                event("promoted: first delay")
                task.state = "queued"
                self.route(task)

    def claim_from_front(self, k: int) -> list[str]:
        """The model of the claim itself: the ids it hands out, in order."""
        expected: list[str] = []
        while len(expected) < k:
            popped = self.pop()
            if popped is None:
                break
            task = self.tasks[popped]
            assert task.state == "queued", task
            grp = self.groups[task.group] if task.group else None
            if grp is not None and (grp.paused or grp.halted is not None):
                event("claim: held back (paused or halted)")
                task.held = True
                grp.held.append(popped)
                continue
            if task.expiring and task.attempt == 0:
                event("claim: expired")
                task.state = "expired"
                self.leave(task)
                continue
            if grp is not None and grp.rate and (grp.window_until or 0) > self.now:
                event("claim: out of rate")
                task.held = True
                grp.held.append(popped)
                if grp.wake_due is None:
                    grp.wake_due = grp.window_until
                continue
            if grp is not None and grp.rate:
                grp.window_until, grp.window_cleared = self.now + RATE_MS, False
            expected.append(popped)
        return expected

    def check_claimed(
        self, reply: _scripts.ClaimReply, k: int, expected: list[str]
    ) -> None:
        """The reply against the model; the model then runs what was claimed."""
        assert [c.id for c in reply.tasks] == expected, (
            [c.id for c in reply.tasks],
            expected,
        )
        for claimed in reply.tasks:
            task = self.tasks[claimed.id]
            assert claimed.envelope == task.envelope
            assert claimed.attempt == task.attempt + 1
            assert claimed.token > self.max_token  # fencing tokens only grow
            if task.group is not None:
                g = self.groups[task.group]
                assert task.id in g.order[: g.slots]
                if task.attempt == 0 and g.order.index(task.id) > 0:
                    event("claimed beside another of its group")
            task.state = "running"
            task.attempt += 1
            task.token = claimed.token
            self.max_token = claimed.token
        for g in self.groups.values():
            running = sum(1 for i in g.order if self.tasks[i].state == "running")
            assert running <= max(g.limit, g.slots)
        runnable = bool(self.ready or self.pready)
        assert reply.more == runnable
        if len(reply.tasks) < k:
            assert not runnable  # no head-of-line blocking

    @precondition(lambda self: self.running())
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        chosen = data.draw(
            st.lists(
                st.sampled_from(self.running()), min_size=1, max_size=3, unique=True
            )
        )
        outcomes, expected = [], []
        for task_id in chosen:
            task = self.tasks[task_id]
            assert task.token is not None
            if task.expired_lease:  # too late: refused, the task is recovered
                event("finish: refused after the lease expired")
                outcomes.append(_scripts.Outcome(task_id, task.token, "ok"))
                expected.append(FinishCode.LEASE_LOST)
                continue
            # Retries weigh double: they are what group order is hardest on.
            kinds: list[_scripts.OutcomeKind] = [
                "ok", "ok", "retry", "retry", "dead", "halt", "back"
            ]  # fmt: skip
            kind = data.draw(st.sampled_from(kinds))
            delay = data.draw(st.sampled_from([0, 1, 5, 20])) if kind == "retry" else 0
            arg1: str | int = "reason"
            if kind == "retry":
                arg1 = FAR_MS if delay else 0
            outcomes.append(_scripts.Outcome(task_id, task.token, kind, arg1, "err"))
            converted = task.cancel_requested and kind in ("retry", "back")
            expected.append(
                FinishCode.APPLIED_AS_CANCEL if converted else FinishCode.APPLIED
            )
            self.retire(task)
            task.finished_with = task.token
            if converted:
                event("finish: cancelled instead of " + kind)
                task.state = "cancelled"
                self.leave(task)
            elif kind == "ok":
                task.state = "succeeded"
                self.leave(task)
            elif kind in ("dead", "halt"):
                task.state = "dead"
                self.leave(task, halt=kind == "halt" and task.group is not None)
            elif kind == "retry" and delay > 0:
                if task.group is not None and self.groups[task.group].exclusive:
                    event("finish: an exclusive group's retry gives its slot on")
                    self.leave(task)
                    task.joined = False  # re-joins the line's tail when due
                task.state, task.due = "delayed", self.now + delay
            elif kind == "retry":
                task.state = "queued"
                self.push(task_id, front=True)
            else:
                task.state = "queued"
                task.attempt -= 1
                self.push(task_id, front=True)
        # Re-sent outcomes in the same batch, and late ones of lost leases.
        extra = data.draw(st.lists(st.sampled_from(outcomes), max_size=1))
        if self.stale:
            for task_id, token in data.draw(
                st.lists(st.sampled_from(self.stale), max_size=2)
            ):
                extra.append(_scripts.Outcome(task_id, token, "ok"))
        for outcome in extra:
            outcomes.append(outcome)
            done = self.tasks[outcome.id].finished_with == outcome.token
            expected.append(FinishCode.DUPLICATE if done else FinishCode.LEASE_LOST)
        codes = self.run(
            _scripts.finish(self.client, KEYS, outcomes, retention_ms=RETENTION_MS)
        )
        assert codes == expected

    @precondition(
        lambda self: any(not self.tasks[i].expired_lease for i in self.running())
    )
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """The consumer stops renewing: its lease deadline is in the past."""
        live = [i for i in self.running() if not self.tasks[i].expired_lease]
        task_id = data.draw(st.sampled_from(live))
        assert self.run(self.client.zadd(KEYS.leases, {task_id: 0}, xx=True)) == 0
        self.tasks[task_id].expired_lease = True

    @precondition(lambda self: self.running() or self.stale)
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        current = [(i, self.tasks[i].token or 0) for i in self.running()]
        pairs = data.draw(
            st.lists(st.sampled_from(current + self.stale), min_size=1, max_size=3)
        )
        codes = self.run(
            _scripts.heartbeat(self.client, KEYS, pairs, lease_ms=LEASE_MS)
        )
        # An expired lease is lost, recovered yet or not.
        assert [int(c) for c in codes] == [
            (2 if self.tasks[pair[0]].cancel_requested else 1)
            if pair in current and not self.tasks[pair[0]].expired_lease
            else 0
            for pair in pairs
        ]

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel any task: a waiting one leaves its place at once (passing its
        slot on), a running one is asked to stop, an ended one is left alone."""
        task = self.tasks[data.draw(st.sampled_from(sorted(self.tasks)))]
        code = self.run(
            _scripts.cancel(self.client, KEYS, task.id, retention_ms=RETENTION_MS)
        )
        if task.state in ("queued", "delayed"):
            assert code is CancelCode.CANCELLED
            g = self.groups[task.group] if task.group else None
            if task.held:
                assert g is not None
                g.held.remove(task.id)
                task.held = False
            else:
                self.remove_ready(task.id)
            if g is not None and task.joined:
                if g.order.index(task.id) < g.slots:
                    event("cancel: a slot holder")
                    self.leave(task)
                else:
                    g.order.remove(task.id)
            task.state, task.due, task.due_now = "cancelled", None, False
        elif task.state == "running":
            assert code is CancelCode.REQUESTED
            task.cancel_requested = True
        elif task.state == "cancelled":  # a re-sent cancel: same answer
            assert code is CancelCode.CANCELLED
        else:
            assert code is CancelCode.FINISHED

    @precondition(lambda self: any(t.state == "dead" for t in self.tasks.values()))
    @rule(data=st.data())
    def requeue_dead(self, data: st.DataObject) -> None:
        """An operator requeues a dead letter: first in its group's line, or at
        once when a slot is free; a group halted by it resumes with it."""
        dead = sorted(i for i, t in self.tasks.items() if t.state == "dead")
        task = self.tasks[data.draw(st.sampled_from(dead))]
        done = self.run(_scripts.dead_action(self.client, KEYS, "requeue", [task.id]))
        assert done == 1
        task.state, task.attempt, task.finished_with = "queued", 0, None
        task.cancel_requested = False  # its cancellation ended with it
        task.expiring = False  # its expiry was for its first start
        if task.group is None:
            self.push(task.id, front=True)
            return
        g = self.groups[task.group]
        if g.halted == task.id:
            event("requeue: the halting task")
            g.halted = None
            g.order.insert(g.slots, task.id)
            g.slots += 1
            self.push(task.id, front=True)
            self.unshelve(g)
        elif self.has_room(g):
            g.order.insert(g.slots, task.id)
            g.slots += 1
            self.push(task.id, front=True)
        else:
            event("requeue: first in line")
            g.order.insert(g.slots, task.id)

    @precondition(lambda self: any(g.halted for g in self.groups.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """An operator lets a halted group go on; the dead task stays dead."""
        halted = sorted(n for n, g in self.groups.items() if g.halted)
        name = data.draw(st.sampled_from(halted))
        assert self.run(_scripts.dead_action(self.client, KEYS, "release", [name])) == 1
        g = self.groups[name]
        g.halted = None
        self.unshelve(g)

    @rule(
        name=st.sampled_from(GROUPS),
        limit=st.sampled_from([1, 1, 2, 3]),
        rate=st.booleans(),
        weight=st.sampled_from([1, 2, 2, 3]),
        exclusive=st.booleans(),
    )
    def set_group(
        self, name: str, limit: int, rate: bool, weight: int, exclusive: bool = False
    ) -> None:
        """Replace a group's concurrency, rate, weight and ordering; free
        slots fill at once."""
        self.run(
            _scripts.control(
                self.client,
                KEYS,
                "group",
                name,
                limit,
                1 if rate else "",
                FAR_MS if rate else "",
                "",
                "",
                weight if weight > 1 else "",
                "exclusive" if exclusive else "",
            )
        )
        g = self.groups[name]
        g.limit, g.rate, g.weight = limit, rate, weight
        g.exclusive = exclusive
        self.fill(g)

    @rule(name=st.sampled_from(GROUPS))
    def pause(self, name: str) -> None:
        self.run(_scripts.control(self.client, KEYS, "pause", name))
        self.groups[name].paused = True

    @rule(name=st.sampled_from(GROUPS))
    def resume(self, name: str) -> None:
        self.run(_scripts.control(self.client, KEYS, "resume", name))
        g = self.groups[name]
        g.paused = False
        self.unshelve(g)

    @rule(drain=st.booleans())
    def fairness(self, drain: bool) -> None:
        """Round-robin (a released group's next task to the tail) or drain."""
        fair = "drain" if drain else ""
        self.run(_scripts.control(self.client, KEYS, "queue", fair, "", "", "", ""))
        self.drain = drain

    def tick(self, ms: int) -> None:
        """Virtual time passes: what falls due gets its due time as its score,
        and a rate window that is over gets its start times in the past."""
        self.now += ms
        scores: dict[str, int] = {
            t.id: t.due or 0
            for t in self.tasks.values()
            if t.state == "delayed" and not t.due_now and (t.due or 0) <= self.now
        }
        for name, g in self.groups.items():
            if g.window_until is not None and g.window_until <= self.now:
                if not g.window_cleared:
                    self.run(self.client.delete(KEYS.rate(name)))
                    self.run(self.client.rpush(KEYS.rate(name), 0))
                    g.window_cleared = True
                g.window_until = None
            if g.wake_due is not None and not g.wake_now and g.wake_due <= self.now:
                scores["~" + name] = g.wake_due
                g.wake_now = True
        if scores:
            assert self.run(self.client.zadd(KEYS.delayed, scores, xx=True)) == 0
            for task_id in scores:
                if not task_id.startswith("~"):
                    self.tasks[task_id].due_now = True

    # -- invariants ----------------------------------------------------------

    @invariant()
    def empty_groups_lose_their_turns(self) -> None:
        """A group's hash (and its turn counter with it) goes once it holds
        nothing: no task in order, none in its first delay, no halt."""
        for name, g in self.groups.items():
            first_delay = any(
                t.group == name and t.state == "delayed" and not t.joined
                for t in self.tasks.values()
            )
            if not (g.order or first_delay or g.halted):
                g.turns, g.turns_stored = 0, False

    @invariant()
    def keys_match_the_model(self) -> None:
        assert self.run(_fsck.examine(self.client, KEYS)).problems == []
        ids = sorted(self.tasks)
        fields, groups, parks, helds, ready, pready, delayed, leases = self.run(
            self.read(ids)
        )
        for task_id, (state, attempt) in zip(ids, fields, strict=True):
            task = self.tasks[task_id]
            assert (_s(state), int(attempt or 0)) == (task.state, task.attempt), task
        for name, state, line, held in zip(GROUPS, groups, parks, helds, strict=True):
            g = self.groups[name]
            marks = {_s(k)[2:]: _s(v) for k, v in state.items() if _s(k)[:2] == "h:"}
            expected = {}
            for task_id in g.order[: g.slots]:
                task = self.tasks[task_id]
                expected[task_id] = {
                    "running": str(task.token),
                    "delayed": "r",
                }.get(task.state, "~" if task.held else "@")
            assert marks == expected, (name, g)
            # The group's line is the rest of the model's order.
            assert [_s(p) for p in line] == g.order[g.slots :], (name, g)
            assert [_s(h) for h in held] == g.held, (name, g)
            assert (_s(state.get(b"!")) if b"!" in state else None) == g.halted
            if g.turns_stored:
                assert int(state.get(b"tn", 0)) == g.turns, (name, g)
        assert [_s(r) for r in ready] == self.ready
        assert [_s(r) for r in pready] == [e[1] for e in self.pready]
        members = {_s(d) for d in delayed}
        assert members == {
            t.id for t in self.tasks.values() if t.state == "delayed"
        } | {"~" + n for n, g in self.groups.items() if g.wake_due is not None}
        assert {_s(x) for x in leases} == set(self.running())

    async def read(self, ids: list[str]) -> list[Any]:
        async with self.client.pipeline(transaction=True) as pipe:
            for task_id in ids:
                pipe.hmget(KEYS.task(task_id), "s", "a")
            for g in GROUPS:
                pipe.hgetall(KEYS.group(g))
            for g in GROUPS:
                pipe.lrange(KEYS.parked(g), 0, -1)
            for g in GROUPS:
                pipe.lrange(KEYS.held(g), 0, -1)
            pipe.lrange(KEYS.ready, 0, -1)
            pipe.zrange(KEYS.pready, 0, -1)
            pipe.zrange(KEYS.delayed, 0, -1)
            pipe.zrange(KEYS.leases, 0, -1)
            replies: list[Any] = await pipe.execute()
        n, m = len(ids), len(GROUPS)
        return [
            replies[:n],
            replies[n : n + m],
            replies[n + m : n + 2 * m],
            replies[n + 2 * m : n + 3 * m],
            *replies[n + 3 * m :],
        ]


@pytest.mark.slow
# Passing takes ~20 s; a failure is shrunk for up to hypothesis's 5 minutes,
# which the default timeout would cut short into a confusing report.
@pytest.mark.timeout(600)
def test_scripts_follow_the_model(redis_url: str) -> None:
    _SERVER["url"] = redis_url
    try:
        run_state_machine_as_test(
            QueueMachine,
            settings=settings(
                max_examples=100,
                stateful_step_count=50,
                deadline=None,
                # One bug, shrunk quickly: each example costs real round trips.
                report_multiple_bugs=False,
            ),
        )
    finally:
        _SERVER.clear()
