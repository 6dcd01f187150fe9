"""Model-based test: random sequences of script calls against a small model.

Hypothesis drives the scripts (enqueue, claim, finish, heartbeat, and cancel)
with random groups, delays, dedup keys, outcomes, re-sent calls, lease
expiries and cancellations, while a Python model keeps, per group, the tasks
that have joined the group's order (oldest first) and each task's state,
attempt and token. After every step the real keys are compared with the model:

* at most one running task per group, and the group's lock is its token;
* a claimed grouped task is always the oldest unfinished task of its group
  (retried and recovered tasks included: a later task never overtakes them),
  and the group's parked list is exactly the rest of the model's order;
* ungrouped tasks never wait: they are never parked, and a claim that returns
  fewer than k tasks leaves nothing runnable behind (no head-of-line blocking);
* ``_fsck.check`` reports nothing, so every live task is in exactly one place,
  and every task's state and attempt count are the model's.

Time is simulated, so that a run is deterministic (hypothesis replays and
shrinks it): claims use a lease nobody outlives, and the ``expire`` rule sets a
running task's score in the leases ZSET to 0 (the epoch), which the next claim
recovers exactly as it would a lease whose consumer died. Likewise delays and
retry backoffs are sent as a day, and the model keeps a virtual clock: each
claim first advances it by a drawn step and rewrites the score of each task
that falls due to its virtual due time (a small number, so in the server's
past, in due order). The claim must then promote exactly those, in that order.

A delayed task joins its group's order when it is promoted (its delay is part
of the enqueue), so the model appends it to the order then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
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

from aiogroupq import _fsck, _scripts
from aiogroupq._keys import QueueKeys

T = TypeVar("T")

KEYS: Final = QueueKeys("model")
#: claims' lease: never expires by itself during a run (expiry is simulated)
LEASE_MS: Final = 600_000
#: what the scripts get as a delay: never due by itself (time is simulated)
FAR_MS: Final = 86_400_000
RETENTION_MS: Final = 600_000
WINDOW_MS: Final = 600_000
GROUPS: Final = ("g1", "g2", "g3")
CONSUMERS: Final = ("c1", "c2")

#: the server of the running test, for the machine (hypothesis builds it)
_SERVER: dict[str, str] = {}

#: (group, delay in ms, max_attempts, dedup key) of one task to enqueue
TaskSpec = tuple[str | None, int, int, str | None]
task_specs = st.tuples(
    st.sampled_from([None, *GROUPS]),
    st.sampled_from([0, 0, 0, 1, 5, 20]),
    st.integers(1, 3),
    st.sampled_from([None, None, None, None, "k1", "k2"]),
)


@dataclass
class ModelTask:
    """What the model knows of one task."""

    id: str
    group: str | None
    envelope: bytes
    max_attempts: int
    #: queued | delayed | running | succeeded | dead | cancelled
    state: str
    #: in its group's order; False only while its first delay runs
    joined: bool
    attempt: int = 0
    token: int | None = None
    #: the lease was set into the past and no claim has recovered it yet
    expired: bool = False
    #: token of the last finish applied, which a re-sent finish repeats
    finished_with: int | None = None
    #: virtual due time while delayed
    due: int | None = None
    #: its delayed score was rewritten to ``due``: the next claim promotes it
    due_now: bool = False
    #: cancelled while running: it must not run again
    cancel_requested: bool = False


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
        self.order: dict[str, list[str]] = {g: [] for g in GROUPS}
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

    # -- model helpers -------------------------------------------------------

    def running(self) -> list[str]:
        """Ids of the running tasks, sorted (draws must not depend on hashing)."""
        return sorted(i for i, t in self.tasks.items() if t.state == "running")

    def leave_order(self, task: ModelTask) -> None:
        """*task*, its group's head, is done for good: the group passes on."""
        if task.group is not None:
            assert self.order[task.group][0] == task.id
            self.order[task.group].pop(0)

    def retire(self, task: ModelTask) -> None:
        """The current token stops owning the task."""
        assert task.token is not None
        self.stale.append((task.id, task.token))
        task.expired = False

    # -- rules ---------------------------------------------------------------

    @initialize(specs=st.lists(task_specs, min_size=3, max_size=10))
    def backlog(self, specs: list[TaskSpec]) -> None:
        """Start with a backlog, so that even short runs have work to claim."""
        self.enqueue_batch(specs)

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
        created: list[tuple[_scripts.NewTask, int]] = []
        for group, delay_ms, max_attempts, dedup in specs:
            task_id = f"t{self.next_id:04d}"
            self.next_id += 1
            batch.append(
                _scripts.NewTask(
                    id=task_id,
                    group=group,
                    envelope=b"env:" + task_id.encode(),
                    delay_ms=FAR_MS if delay_ms else 0,
                    max_attempts=max_attempts,
                    dedup_key=dedup,
                )
            )
            if dedup is not None and dedup in self.dedup:
                expected.append(self.dedup[dedup])  # deduplicated: not created
                continue
            if dedup is not None:
                self.dedup[dedup] = task_id
            expected.append(task_id)
            created.append((batch[-1], delay_ms))
        ids = self.run(
            _scripts.enqueue(self.client, KEYS, batch, dedup_window_ms=WINDOW_MS)
        )
        assert ids == expected
        self.sent.append((batch, ids))
        for new, delay_ms in created:
            task = ModelTask(
                new.id,
                new.group,
                new.envelope,
                new.max_attempts,
                state="delayed" if delay_ms > 0 else "queued",
                joined=delay_ms == 0,
                due=self.now + delay_ms if delay_ms > 0 else None,
            )
            self.tasks[new.id] = task
            if task.joined and task.group is not None:
                self.order[task.group].append(task.id)

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
        elapsed=st.sampled_from([0, 0, 1, 5, 25]),
    )
    def claim(self, k: int, consumer: str, elapsed: int) -> None:
        """*elapsed* virtual ms pass, then a claim (which recovers, promotes)."""
        self.tick(elapsed)
        before = [_s(m) for m in self.run(self.client.zrange(KEYS.delayed, 0, -1))]
        reply = self.run(
            _scripts.claim(
                self.client, KEYS, consumer, k=k, lease_ms=LEASE_MS, scan_limit=1000
            )
        )
        after = {_s(m) for m in self.run(self.client.zrange(KEYS.delayed, 0, -1))}

        # (a) Every expired lease was recovered, before anything was claimed.
        for task in self.tasks.values():
            if task.state == "running" and task.expired:
                self.retire(task)
                if task.cancel_requested:
                    event("recovery: cancelled")
                    task.state = "cancelled"
                    self.leave_order(task)
                elif task.attempt >= task.max_attempts:
                    event("recovery: dead-lettered")
                    task.state = "dead"
                    self.leave_order(task)
                else:
                    event("recovery: requeued")
                    task.state = "queued"  # still its group's oldest

        # (b) Exactly what was due left the delayed set, in due order.
        promoted = [i for i in before if i not in after]
        due = sorted(
            (t for t in self.tasks.values() if t.state == "delayed" and t.due_now),
            key=lambda t: (t.due or 0, t.id),
        )
        assert promoted == [t.id for t in due]
        for task_id in promoted:
            task = self.tasks[task_id]
            task.state = "queued"
            task.due, task.due_now = None, False
            event("promoted: " + ("first delay" if not task.joined else "retry"))
            if not task.joined:  # a first delay ends: join the group's order
                task.joined = True
                if task.group is not None:
                    self.order[task.group].append(task_id)

        # (c) The claimed tasks.
        groups_taken: set[str] = set()
        for claimed in reply.tasks:
            task = self.tasks[claimed.id]
            assert task.state == "queued", (claimed, task)
            assert claimed.envelope == task.envelope
            assert claimed.attempt == task.attempt + 1
            assert claimed.token > self.max_token  # fencing tokens only grow
            if task.group is not None:
                # Group order: the oldest unfinished task of its group, and
                # group exclusion: nothing else of the group is running.
                assert self.order[task.group][0] == task.id, (
                    task.id,
                    self.order[task.group],
                )
                assert not any(
                    t.group == task.group and t.state == "running"
                    for t in self.tasks.values()
                )
                assert task.group not in groups_taken
                groups_taken.add(task.group)
            if task.group is not None and len(self.order[task.group]) > 1:
                event("claimed a head with tasks parked behind it")
            if task.attempt > 0:
                event("claimed a task again")
            task.state = "running"
            task.attempt += 1
            task.token = claimed.token
            self.max_token = claimed.token

        ready_left = self.run(self.client.llen(KEYS.ready))
        assert reply.more == (ready_left > 0)
        assert (reply.wait_ms >= 0) == bool(after)
        if len(reply.tasks) < k:
            # Nothing runnable was left behind: every queued task waits behind
            # a running task or a retry of its own group (never a lock of
            # another group, never for being ungrouped).
            assert ready_left == 0
            for task in self.tasks.values():
                if task.state == "queued":
                    assert task.group is not None, task
                    head = self.tasks[self.order[task.group][0]]
                    assert head.id != task.id, task
                    assert head.state in ("running", "delayed"), (task, head)

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
            # Retries weigh double: they are what group order is hardest on.
            kind = data.draw(st.sampled_from(["ok", "retry", "retry", "dead", "back"]))
            delay = data.draw(st.sampled_from([0, 1, 5, 20])) if kind == "retry" else 0
            arg1: str | int = "reason"
            if kind == "retry":
                arg1 = FAR_MS if delay else 0
            outcomes.append(_scripts.Outcome(task_id, task.token, kind, arg1, "err"))
            converted = task.cancel_requested and kind in ("retry", "back")
            expected.append(
                _scripts.APPLIED_AS_CANCEL if converted else _scripts.APPLIED
            )
            self.retire(task)
            task.finished_with = task.token
            if converted:
                event("finish: cancelled instead of " + kind)
                task.state = "cancelled"
                self.leave_order(task)
            elif kind == "ok":
                task.state = "succeeded"
                self.leave_order(task)
            elif kind == "dead":
                task.state = "dead"
                self.leave_order(task)
            elif kind == "retry" and delay > 0:
                task.state, task.due = "delayed", self.now + delay
            elif kind == "retry":
                task.state = "queued"
            else:
                task.state = "queued"
                task.attempt -= 1
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
            expected.append(_scripts.DUPLICATE if done else _scripts.LEASE_LOST)
        codes = self.run(
            _scripts.finish(self.client, KEYS, outcomes, retention_ms=RETENTION_MS)
        )
        assert codes == expected

    @precondition(lambda self: any(not self.tasks[i].expired for i in self.running()))
    @rule(data=st.data())
    def expire(self, data: st.DataObject) -> None:
        """The consumer stops renewing: its lease deadline is in the past."""
        live = [i for i in self.running() if not self.tasks[i].expired]
        task_id = data.draw(st.sampled_from(live))
        assert self.run(self.client.zadd(KEYS.leases, {task_id: 0}, xx=True)) == 0
        self.tasks[task_id].expired = True

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
        assert [int(c) for c in codes] == [
            (2 if self.tasks[pair[0]].cancel_requested else 1) if pair in current else 0
            for pair in pairs
        ]
        for task_id, token in pairs:
            if (task_id, token) in current:
                self.tasks[task_id].expired = False  # renewed before recovery

    @precondition(lambda self: self.tasks)
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        """Cancel any task: a waiting one leaves its group's line at once, a
        running one is asked to stop, a finished one is left alone."""
        task = self.tasks[data.draw(st.sampled_from(sorted(self.tasks)))]
        code = self.run(
            _scripts.cancel(self.client, KEYS, task.id, retention_ms=RETENTION_MS)
        )
        if task.state in ("queued", "delayed"):
            assert code == _scripts.CANCELLED
            if task.joined and task.group is not None:
                self.order[task.group].remove(task.id)
            task.state, task.due, task.due_now = "cancelled", None, False
        elif task.state == "running":
            assert code == _scripts.REQUESTED
            task.cancel_requested = True
        elif task.state == "cancelled":  # a re-sent cancel: same answer
            assert code == _scripts.CANCELLED
        else:
            assert code == _scripts.FINISHED

    def tick(self, ms: int) -> None:
        """Virtual time passes: what falls due gets its due time as its score."""
        self.now += ms
        due = {
            t.id: t.due or 0
            for t in self.tasks.values()
            if t.state == "delayed" and not t.due_now and (t.due or 0) <= self.now
        }
        if due:
            assert self.run(self.client.zadd(KEYS.delayed, due, xx=True)) == 0
            for task_id in due:
                self.tasks[task_id].due_now = True

    # -- invariants ----------------------------------------------------------

    @invariant()
    def keys_match_the_model(self) -> None:
        assert self.run(_fsck.check(self.client, KEYS)) == []
        ids = sorted(self.tasks)
        fields, locks, parks, ready, delayed, leases = self.run(self.read(ids))
        for task_id, (state, attempt) in zip(ids, fields, strict=True):
            task = self.tasks[task_id]
            assert (_s(state), int(attempt)) == (task.state, task.attempt), task
        for g, lock, parked in zip(GROUPS, locks, parks, strict=True):
            order = self.order[g]
            if not order:
                expected = None
            else:
                head = self.tasks[order[0]]
                running = head.state == "running"
                expected = str(head.token) if running else "@" + head.id
            assert (None if lock is None else _s(lock)) == expected, (g, order)
            # The group's order is the model's: its head, then the parked list.
            assert [_s(p) for p in parked] == order[1:], (g, order)
        heads = {o[0] for o in self.order.values() if o}
        assert {_s(r) for r in ready} == {
            t.id
            for t in self.tasks.values()
            if t.state == "queued" and (t.group is None or t.id in heads)
        }
        assert {_s(d) for d in delayed} == {
            t.id for t in self.tasks.values() if t.state == "delayed"
        }
        assert {_s(x) for x in leases} == set(self.running())

    async def read(self, ids: list[str]) -> list[Any]:
        async with self.client.pipeline(transaction=True) as pipe:
            for task_id in ids:
                pipe.hmget(KEYS.task(task_id), "s", "a")
            for g in GROUPS:
                pipe.get(KEYS.lock(g))
            for g in GROUPS:
                pipe.lrange(KEYS.parked(g), 0, -1)
            pipe.lrange(KEYS.ready, 0, -1)
            pipe.zrange(KEYS.delayed, 0, -1)
            pipe.zrange(KEYS.leases, 0, -1)
            replies: list[Any] = await pipe.execute()
        n, m = len(ids), len(GROUPS)
        return [
            replies[:n],
            replies[n : n + m],
            replies[n + m : n + 2 * m],
            *replies[n + 2 * m :],
        ]


@pytest.mark.slow
# Passing takes ~15 s; a failure is shrunk for up to hypothesis's 5 minutes,
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
