"""What an operator sees of a queue: the public views of its counts, groups,
tasks and consumers (:class:`QueueStats`, :class:`GroupInfo`,
:class:`TaskDetails`, :class:`ConsumerInfo`, ...), as ``_inspect/reads.py``
and ``_inspect/consumers.py`` read them from the scripts.

Times are Unix seconds on the Redis server's clock (the scripts' ``TIME``),
like :attr:`DeadLetter.dead_at`; ages are measured against that clock too.
"""

from __future__ import annotations

__all__ = (
    "ConsumerInfo",
    "ConsumerState",
    "ConsumerStats",
    "GroupInfo",
    "GroupPage",
    "GroupState",
    "GroupTask",
    "QueueStats",
    "TaskDetails",
)

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ..task import TaskState

GroupSort = Literal["busiest", "oldest", "halted", "paused"]
Slot = Literal["running", "ready", "retry", "held", "line"]
#: what is known of a consumer: ``"alive"`` (heartbeating); ``"silent"`` (its
#: heartbeat is late, its lease not over yet: stuck, cut off, or dead on
#: another host); ``"gone"`` (silent past its lease, its process is not
#: running on this host, or not registered)
ConsumerState = Literal["alive", "silent", "gone"]


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Counters of one consumer since it was created, over all its runs
    (see :attr:`Consumer.stats`).

    ``loop_blocked`` counts the times the event loop did not run for a third
    of ``lease_ttl`` (at most 1 s) or longer: a handler blocked it.
    """

    claimed: int
    succeeded: int
    retried: int
    dead: int
    cancelled: int
    handed_back: int
    lease_lost: int
    running: int
    loop_blocked: int = 0


class GroupState(enum.StrEnum):
    """Why a group runs, or does not (the first that applies, in this order)."""

    #: a key of the group is damaged (run ``aiogroupq check``)
    DAMAGED = "damaged"
    #: stopped behind a dead-lettered task (``on_dead="halt"``) until it is
    #: requeued or purged, or the group is released
    HALTED = "halted"
    #: the group, or the whole queue, is paused: nothing new starts
    PAUSED = "paused"
    #: its next task waits until the group's rate limit frees a start
    RATE_LIMITED = "rate_limited"
    #: its next task failed and waits out its retry backoff; later tasks of
    #: the group wait behind it
    WAITING_RETRY = "waiting_retry"
    #: its next task is runnable and waits for a free consumer
    READY = "ready"
    #: every slot (its concurrency) runs a task and more tasks wait in line
    AT_CAP = "at_cap"
    #: tasks are running and none waits behind them
    RUNNING = "running"
    #: its only tasks are delayed ones that are not due yet
    DELAYED = "delayed"
    #: no live task
    IDLE = "idle"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class GroupTask:
    """A task at the front of its group: a slot holder, or the first in line.

    :ivar id: the task id
    :ivar slot: ``"running"``; ``"ready"`` (waits for a consumer);
        ``"retry"`` (waits out its backoff); ``"held"`` (held back by a pause,
        a halt or the rate limit); ``"line"`` (first behind the slot holders)
    :ivar attempt: attempts started so far
    :ivar max_attempts: attempts allowed
    :ivar consumer: the consumer running it, if it runs
    :ivar lease_deadline: when a running task's lease runs out unless renewed
    :ivar due_at: when it may start: its retry's due time, the moment the rate
        limit frees, or when it became runnable (already due)
    :ivar consumer_alive: for a running task, whether its consumer is alive
        (it sent a heartbeat within its lease and, registered on this host,
        its process runs); ``None`` otherwise
    :ivar consumer_heartbeat: for a running task, its consumer's latest
        heartbeat, if the registry still has it
    :ivar consumer_state: for a running task, its consumer's
        state (``"alive"``, ``"silent"`` or ``"gone"``); ``None`` otherwise
    :ivar consumer_status: for a running task, its consumer's state in
        words, as ``ConsumerInfo.status``; ``None`` otherwise
    """

    id: str
    slot: Slot
    attempt: int
    max_attempts: int
    consumer: str | None = None
    lease_deadline: float | None = None
    due_at: float | None = None
    consumer_alive: bool | None = None
    consumer_heartbeat: float | None = None
    consumer_state: ConsumerState | None = None
    consumer_status: str | None = None


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group as seen now: the answer to "why is my group not running".

    :ivar group: the group key
    :ivar state: what the group is doing, or waiting for
    :ivar reason: one sentence that explains *state* with the figures; it
        also says when a running task's consumer stopped heartbeating (or
        its lease ran out), when that lease ends and what recovers the task
    :ivar running: its tasks running now
    :ivar backlog: its tasks waiting in line behind the slot holders
    :ivar delayed: its tasks still in their first delay (not in line yet)
    :ivar concurrency: how many of its tasks may run at once
    :ivar holders: the tasks holding its slots, running first (100 at most)
    :ivar head: the next task to start (a holder that is not running, else
        the first in line), or ``None``
    :ivar oldest_age: seconds its longest-waiting task has waited, or ``None``
    :ivar waiting_since: since when its line has not been empty, or ``None``
    :ivar halted_by: the dead task it is halted behind, or ``None``
    :ivar halted_reason: that task's dead-letter reason (shortened)
    :ivar paused: the group itself is paused
    :ivar queue_paused: the whole queue is paused
    :ivar rate: ``(starts, seconds)`` of its rate limit, or ``None``
    :ivar rate_free_at: when its rate limit allows the next start, if it waits
    :ivar max_size: the most live tasks it may hold, or ``None``
    :ivar full: it holds *max_size* live tasks: enqueues are refused
    :ivar consumers_alive: live consumers of the queue (less those holding
        its tasks whose process is known gone)
    :ivar now: the server's clock when it was read
    :ivar next_due_at: when its first delayed task is due, for a group whose
        only tasks are delayed ones (found among the queue's first 1,000
        delayed tasks), else ``None``
    :ivar weight: its share of starts under backlog relative to other
        groups (its own weight, else the queue's default; 1 unless set)
    :ivar ordering: ``"strict"`` (a retry holds the group) or
        ``"exclusive"`` (later tasks run while a retry waits)
    """

    group: str
    state: GroupState
    reason: str
    running: int
    backlog: int
    delayed: int
    concurrency: int
    holders: tuple[GroupTask, ...]
    head: GroupTask | None
    oldest_age: float | None
    waiting_since: float | None
    halted_by: str | None
    halted_reason: str | None
    paused: bool
    queue_paused: bool
    rate: tuple[int, float] | None
    rate_free_at: float | None
    max_size: int | None
    full: bool
    consumers_alive: int
    now: float
    next_due_at: float | None = None
    weight: int = 1
    ordering: Literal["strict", "exclusive"] = "strict"


@dataclass(frozen=True, slots=True)
class GroupPage:
    """One page of :meth:`Admin.groups`.

    :ivar groups: the groups of this page
    :ivar next_cursor: pass it as ``cursor`` for the next page; ``None`` after
        the last one
    """

    groups: tuple[GroupInfo, ...]
    next_cursor: int | None


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    """A consumer as its latest heartbeat registered it, and what is known
    of it now.

    Whether its process runs is known only for a consumer registered with
    this machine's host name (``socket.gethostname()``): its pid is looked
    up here. A consumer in another container that shares the host name but
    not the process namespace would be judged by a pid of this one's, so
    give containers their own host names (the default).

    :ivar name: its name (the owner recorded on the tasks it runs)
    :ivar host: its host name
    :ivar pid: its process id on that host
    :ivar alive: it has sent a heartbeat within its lease and, registered on
        this host, its process runs
    :ivar last_heartbeat: when it sent its latest heartbeat
    :ivar started: when its process registered first (a restart with the
        same name starts it again)
    :ivar in_flight: tasks it holds now: its recovery keys on the server,
        where a dead consumer's tasks stay until they are recovered (in
        ``QueueStats.consumers``: the count of its latest heartbeat)
    :ivar concurrency: handlers it runs at once
    :ivar lease_ttl: its lease, in seconds: silent longer, it counts as gone
    :ivar stats: its counters at its latest heartbeat
    :ivar state: ``"alive"``, ``"silent"`` (its heartbeat is late) or
        ``"gone"`` (silent past its lease, or its process is not running
        on this host)
    :ivar status: *state* in words: ``alive``, ``silent for 12.0s
        (heartbeat due every 10.0s)``, ``gone (pid not running)``, ``gone
        (silent for 45.0s, past its 30.0s lease)``
    :ivar pid_running: whether its process runs: ``None`` unless it is
        registered on this host
    :ivar heartbeat_every: seconds between its heartbeats (a third of its
        lease)
    :ivar partitions: the partitions it serves, as its latest heartbeat
        registered them (every one for a queue of one partition, or a
        fleet no larger than its ``partition_replicas``; empty: it stands
        by); ``None`` when not known (a consumer of an older version, one
        still starting, or a reading of ``stats``)
    """

    name: str
    host: str
    pid: int
    alive: bool
    last_heartbeat: float
    started: float
    in_flight: int
    concurrency: int
    lease_ttl: float
    stats: ConsumerStats
    state: ConsumerState = "alive"
    status: str = "alive"
    pid_running: bool | None = None
    heartbeat_every: float = 0.0
    partitions: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's counts, read in one call from counters the scripts keep.

    :ivar queue: the queue name
    :ivar exists: anything was ever enqueued, configured or consumed there
    :ivar now: the server's clock when it was read
    :ivar paused: the whole queue is paused
    :ivar ready: tasks runnable now, waiting for a consumer
    :ivar parked: tasks waiting in their groups' lines behind busy groups
    :ivar held: tasks held back by their group: all the waiting tasks of
        paused and halted groups (their lines and next tasks), and the next
        tasks of groups out of their rate. The lines of at most 1,000 paused
        and 1,000 halted groups are looked at; beyond them, their tasks count
        as ready or parked
    :ivar delayed: tasks waiting for a due time (delays and retry backoffs)
    :ivar running: tasks running now
    :ivar dead: dead letters kept
    :ivar groups: groups with live tasks (or halted)
    :ivar groups_waiting: groups with tasks in line behind their slot holders
    :ivar groups_halted: groups halted behind a dead task
    :ivar groups_paused: paused groups
    :ivar groups_rate_limited: groups waiting for their rate limit
    :ivar consumers_alive: consumers that sent a heartbeat within their lease
    :ivar consumers_gone: consumers that stopped sending heartbeats without
        leaving, within the last few leases (100 at most are counted)
    :ivar consumers: the live consumers, latest heartbeat first (100 at most)
    :ivar oldest_waiting: seconds the longest-waiting work has waited: the
        ready queue's head, or the group whose line has not been empty the
        longest; ``None`` when nothing waits
    :ivar next_due_in: seconds until the next delayed task (or rate-limited
        group) is due, ``None`` if none
    :ivar totals: counts since the queue began: ``enqueued``, ``started``,
        ``succeeded``, ``retried``, ``dead``, ``cancelled``, ``expired``,
        ``recovered`` (ended tasks are kept readable for their retention
        window; these totals stand for them, as counting them one by one
        would need a scan)
    :ivar partitions: the queue's partitions (counts are their sums)
    :ivar partitions_target: while the queue is being repartitioned, the
        partition count it moves to, else ``None``
    """

    queue: str
    exists: bool
    now: float
    paused: bool
    ready: int
    parked: int
    held: int
    delayed: int
    running: int
    dead: int
    groups: int
    groups_waiting: int
    groups_halted: int
    groups_paused: int
    groups_rate_limited: int
    consumers_alive: int
    consumers_gone: int
    consumers: tuple[ConsumerInfo, ...]
    oldest_waiting: float | None
    next_due_in: float | None
    totals: Mapping[str, int]
    partitions: int = 1
    partitions_target: int | None = None

    @property
    def waiting(self) -> int:
        """Tasks waiting to run: ready, parked and held back."""
        return self.ready + self.parked + self.held


@dataclass(frozen=True, slots=True)
class TaskDetails:
    """One task as seen now (:meth:`Admin.task`).

    :ivar id: the task id
    :ivar state: its state
    :ivar type: its task type (``None`` only if its stored envelope is
        unreadable)
    :ivar group: its group, or ``None``
    :ivar priority: its priority (0 to 9)
    :ivar attempt: attempts started
    :ivar max_attempts: attempts allowed
    :ivar consumer: the consumer running it, if it runs
    :ivar lease_deadline: when its lease runs out unless renewed, if it runs
    :ivar due_at: when a delayed task (or a retry) is due
    :ivar runnable_since: when it last became runnable; ``None`` while it
        waits for a due time, and once it ended (a dead letter keeps it)
    :ivar enqueued_at: the producer's clock at enqueue
    :ivar ended_at: when it ended, if it did
    :ivar expires_at: the time before which it must start, if it has one
    :ivar error: the last error (a retry's) or the dead-letter reason
    :ivar traceback: a dead letter's traceback, or ``None``
    :ivar cancel_requested: cancellation was requested while it ran
    :ivar slot: where it stands in its group (see :class:`GroupTask`), or
        ``None``
    :ivar position: tasks of its group before it: 0 for a running task or its
        group's next; ``None`` when it does not wait in a group's order
    :ivar payload: its payload as builtins, while the task lives or is a
        dead letter (an ended task keeps only its size), if it decodes
    :ivar has_result: a result is stored (``Producer.result``)
    :ivar kept_for: seconds before an ended task's state expires; ``None``
        while it lives or for a dead letter (kept until purged)
    :ivar now: the server's clock when it was read
    :ivar reason: one sentence that says why it runs, waits or ended: its
        group paused or halted, its due time, its place in line, its
        consumer gone silent, ...
    :ivar payload_size: its encoded payload's size in bytes, if known
    :ivar consumer_alive: for a running task, whether its consumer is alive;
        ``None`` otherwise
    :ivar consumer_heartbeat: for a running task, its consumer's latest
        heartbeat, if the registry still has it
    :ivar consumer_state: for a running task, its consumer's
        state (``"alive"``, ``"silent"`` or ``"gone"``); ``None`` otherwise
    :ivar consumer_status: for a running task, its consumer's state in
        words, as ``ConsumerInfo.status``; ``None`` otherwise
    """

    id: str
    state: TaskState
    type: str | None
    group: str | None
    priority: int
    attempt: int
    max_attempts: int
    consumer: str | None
    lease_deadline: float | None
    due_at: float | None
    runnable_since: float | None
    enqueued_at: float | None
    ended_at: float | None
    expires_at: float | None
    error: str | None
    traceback: str | None
    cancel_requested: bool
    slot: Slot | None
    position: int | None
    payload: Any
    has_result: bool
    kept_for: float | None
    now: float
    reason: str = ""
    payload_size: int | None = None
    consumer_alive: bool | None = None
    consumer_heartbeat: float | None = None
    consumer_state: ConsumerState | None = None
    consumer_status: str | None = None


def span_text(seconds: float) -> str:
    """A duration for people: 850ms, 12.5s, 4m10s, 3h05m, 2d04h."""
    if not math.isfinite(seconds):  # from a stored time no script wrote
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
