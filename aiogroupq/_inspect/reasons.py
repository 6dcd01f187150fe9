"""Why a group or a task is (not) running: the one sentence each view's
``reason`` holds, worked out from what ``_inspect/reads.py`` read, with the
command that unblocks it where there is one. Pure functions of a view: no
Redis here.
"""

from __future__ import annotations

__all__ = ("group_reason", "stall_text", "task_reason")

from datetime import UTC, datetime

from ..task import TaskState
from .consumers import release_hint
from .views import ConsumerState, GroupInfo, GroupState, TaskDetails, span_text


def _tasks(n: int, what: str = "task") -> str:
    """'1 delayed task', '3 delayed tasks'."""
    return f"{n} {what}{'' if n == 1 else 's'}"


def _ago(now: float, then: float | None) -> str:
    if then is None:
        return "?"
    return f"{span_text(now - then)} ago"


def _in(now: float, then: float | None) -> str:
    if then is None:
        return "?"
    return f"in {span_text(then - now)}" if then > now else "now"


def _at(then: float) -> str:
    """A server time of day, UTC (the times these sentences name are within
    hours of now)."""
    return datetime.fromtimestamp(then, UTC).strftime("%H:%M:%SZ")


def stall_text(
    now: float,
    subject: str,
    consumer: str,
    state: ConsumerState | None,
    status: str | None,
    heartbeat: float | None,
    lease_deadline: float | None,
    consumers_alive: int,
) -> str | None:
    """Why a running task may be running no more: *subject* (its
    *consumer*, named) is silent, its process is gone, it stopped
    heartbeating, or the lease ran out; with when the lease ends, what
    recovers the task, and how to hand it back at once where that is
    allowed. ``None`` while the consumer is alive and the lease lasts.
    *consumers_alive* counts a silent consumer, not one whose process is
    known gone."""
    overdue = lease_deadline is not None and lease_deadline <= now
    if state == "alive" and not overdue:
        return None
    silent = state == "silent"
    if state == "alive":
        who = f"{subject} is alive but did not renew the lease"
    elif silent:
        who = f"{subject} is {status}"
    elif status == "gone (pid not running)":
        who = f"{subject} is gone (its process is not running on this host)"
    elif heartbeat is not None:
        who = f"{subject} stopped heartbeating {span_text(now - heartbeat)} ago"
    else:
        who = f"{subject} is not alive (not in the consumer registry)"
    # The lease's end as a time of day, not "in 20s": the sentence stays
    # the same from one read to the next while nothing changes.
    if lease_deadline is None:
        lease = "the lease is gone"
    elif overdue:
        lease = f"the lease ended at {_at(lease_deadline)}"
    else:
        lease = f"the lease ends at {_at(lease_deadline)}"
    # A silent consumer is among the live ones, and may come back.
    others = consumers_alive - (1 if silent else 0)
    if others <= 0:
        then = (
            "no other consumer is alive to recover the task then: start one"
            if silent
            else "no consumer is alive to recover the task: start one"
        )
    elif overdue or lease_deadline is None:
        then = "the next claim recovers the task"
    else:
        then = (
            f"the first claim after that recovers the task ({_in(now, lease_deadline)})"
        )
        if silent:
            then += " unless its consumer comes back"
    # Allowed once the consumer is not counted alive or its process is
    # known gone (Admin.release_consumer): never for a silent one.
    if state == "gone":
        then += f"; to hand it back now: {release_hint(consumer)}"
    return f"{who}; {lease}; {then}"


def _stall(info: GroupInfo) -> str | None:
    """The first running holder that may be running no more, said as
    :func:`stall_text` says it (and how many more there are)."""
    said = [
        text
        for h in info.holders
        if h.slot == "running"
        and h.consumer is not None
        and (
            text := stall_text(
                info.now,
                f"task {h.id}'s consumer {h.consumer}",
                h.consumer,
                h.consumer_state,
                h.consumer_status,
                h.consumer_heartbeat,
                h.lease_deadline,
                info.consumers_alive,
            )
        )
        is not None
    ]
    if not said:
        return None
    n = len(said) - 1
    more = (
        " (1 more running task is in the same case)"
        if n == 1
        else f" ({n} more running tasks are in the same case)"
    )
    return said[0] + (more if len(said) > 1 else "")


def group_reason(
    info: GroupInfo,
    *,
    ready: int,
    retry: int,
    held: int,
    horizon: float | None = None,
) -> tuple[GroupState, str]:
    """The group's state and why it is in it, from *info* (whose own state
    and reason are not read) and the counts of its slot holders that are
    *ready*, waiting for a *retry* and *held* back by its rate; *horizon*:
    the time before which none of its delayed tasks is due, when the first
    due one was not looked for further."""
    state, reason = _why_state(
        info, ready=ready, retry=retry, held=held, horizon=horizon
    )
    stall = _stall(info)
    if stall is None:
        return state, reason
    if state == GroupState.RUNNING:  # instead of its consumer and lease
        return state, f"{info.running} running, but {stall}"
    if state == GroupState.AT_CAP:
        return state, f"{reason}; but {stall}"
    return state, f"{reason}; meanwhile {stall}"


def _why_state(
    info: GroupInfo, *, ready: int, retry: int, held: int, horizon: float | None
) -> tuple[GroupState, str]:
    now, g = info.now, info.group
    behind = (
        f"; {info.backlog} more {_wait(info.backlog)} in line" if info.backlog else ""
    )
    nobody = "; no consumer is alive" if info.consumers_alive == 0 else ""
    head = info.head
    if info.halted_by is not None:
        why = f": {info.halted_reason}" if info.halted_reason else ""
        return GroupState.HALTED, (
            f"halted behind dead task {info.halted_by}{why}; requeue or purge it, "
            f"or release the group (aiogroupq release {g}){behind}"
        )
    if info.paused or info.queue_paused:
        which = (
            f"the group is paused (aiogroupq resume {g})"
            if info.paused
            else "the whole queue is paused (aiogroupq resume)"
        )
        waiting = ready + retry + held + info.backlog
        return GroupState.PAUSED, (
            f"{which}: nothing new starts; {info.running} running, {waiting} waiting"
        )
    if held and head is not None:
        limit = info.rate or (0, 0.0)
        return GroupState.RATE_LIMITED, (
            f"its rate limit ({limit[0]} starts per {span_text(limit[1])}) is used up: "
            f"task {head.id} may start {_in(now, info.rate_free_at)}{behind}"
        )
    if retry and head is not None:
        return GroupState.WAITING_RETRY, (
            f"task {head.id} failed attempt {head.attempt} of {head.max_attempts} "
            f"and retries {_in(now, head.due_at)}; later tasks wait behind it"
            f"{behind}"
        )
    if ready and head is not None:
        return GroupState.READY, (
            f"task {head.id} is runnable since {_ago(now, head.due_at)} and waits "
            f"for a free consumer{nobody}{behind}"
        )
    if info.running and info.backlog:
        return GroupState.AT_CAP, (
            f"{info.running} running, at its concurrency of {info.concurrency}; "
            f"{info.backlog} {_wait(info.backlog)} in line behind"
        )
    if info.running:
        first = info.holders[0] if info.holders else None
        where = (
            f": task {first.id} on consumer {first.consumer}, its lease "
            f"{_renewed(now, first.lease_deadline)}"
            if first is not None and first.slot == "running"
            else ""
        )
        return GroupState.RUNNING, f"{info.running} running{where}"
    if info.delayed:
        return GroupState.DELAYED, _delayed(info, horizon, nobody)
    return GroupState.IDLE, "no live task"


def _wait(n: int) -> str:
    return "waits" if n == 1 else "wait"


def _renewed(now: float, deadline: float | None) -> str:
    """A live holder's lease: when it ends unless its consumer renews it."""
    if deadline is None:
        return "is gone"
    if deadline <= now:
        return f"ended {span_text(now - deadline)} ago"
    return f"ends {_in(now, deadline)} unless renewed"


def _delayed(info: GroupInfo, horizon: float | None, nobody: str) -> str:
    now, due, n = info.now, info.next_due_at, info.delayed
    tasks = _tasks(n, "delayed task")
    first = "it" if n == 1 else "the first"
    none = "not" if n == 1 else "none"
    if due is not None and due <= now:
        return (
            f"{tasks}: {first} was due {span_text(now - due)} ago "
            f"(at {_at(due)}) and the next claim makes it runnable{nobody}"
        )
    if due is not None:
        return (
            f"{tasks}, {none} due yet: {first} is due {_in(now, due)} (at {_at(due)})"
        )
    if horizon is not None:
        return f"{tasks}, {none} due before {_at(horizon)} ({_in(now, horizon)})"
    return f"{tasks}, {none} due yet"


# -- tasks ---------------------------------------------------------------------


def task_reason(
    t: TaskDetails,
    *,
    queue_paused: bool,
    group_paused: bool,
    halted_by: str | None,
    alive: int | None,
) -> str:
    """Why the task runs, waits, or ended: one sentence, as for a group."""
    if t.state not in (TaskState.QUEUED, TaskState.DELAYED, TaskState.RUNNING):
        return _ended(t, halted_by)
    if t.state == TaskState.RUNNING:
        return _running(t, alive)
    blocker = _blocker(
        t.group,
        queue_paused=queue_paused,
        group_paused=group_paused,
        halted_by=halted_by,
    )
    if t.state == TaskState.DELAYED:
        return _task_delayed(t, blocker)
    return _task_waiting(t, blocker, alive)


def _ended(t: TaskDetails, halted_by: str | None) -> str:
    """A dead letter (what to do with it) or another ended task (how long
    its state is kept)."""
    now, g = t.now, t.group
    if t.state == TaskState.DEAD:
        halts = f"; its group {g} is halted behind it" if halted_by == t.id else ""
        return (
            f"dead-lettered {_ago(now, t.ended_at)}: requeue or purge it "
            f"(aiogroupq dead requeue {t.id}){halts}"
        )
    kept = (
        f"; its state is kept {span_text(t.kept_for)} more"
        if t.kept_for is not None
        else ""
    )
    return f"{t.state} {_ago(now, t.ended_at)}{kept}"


def _running(t: TaskDetails, alive: int | None) -> str:
    """On which consumer and until when, or why it may be running no more."""
    now = t.now
    stall = stall_text(
        now,
        f"its consumer {t.consumer}",
        t.consumer or "",
        t.consumer_state,
        t.consumer_status,
        t.consumer_heartbeat,
        t.lease_deadline,
        alive or 0,
    )
    if stall is not None:
        return f"running, but {stall}"
    return (
        f"running on consumer {t.consumer} (attempt {t.attempt} of "
        f"{t.max_attempts}); its lease {_renewed(now, t.lease_deadline)}"
    )


def _blocker(
    g: str | None, *, queue_paused: bool, group_paused: bool, halted_by: str | None
) -> str | None:
    """What keeps a waiting task of group *g* from starting, with the command
    that lifts it; ``None`` if nothing does."""
    if queue_paused:
        return "the whole queue is paused (aiogroupq resume)"
    if halted_by is not None:
        return (
            f"its group {g} is halted behind dead task {halted_by}: requeue or "
            f"purge it, or release the group (aiogroupq release {g})"
        )
    if group_paused:
        return f"its group {g} is paused (aiogroupq resume {g})"
    return None


def _task_delayed(t: TaskDetails, blocker: str | None) -> str:
    """A delayed task or a retry: when it is due, and what holds it then."""
    now = t.now
    if t.due_at is not None and t.due_at <= now:
        when = (
            f"was due {span_text(now - t.due_at)} ago (at {_at(t.due_at)}): "
            "the next claim makes it runnable"
        )
    else:
        when = f"is due {_in(now, t.due_at)}"
        if t.due_at is not None:
            when += f" (at {_at(t.due_at)})"
    text = (
        f"attempt {t.attempt} of {t.max_attempts} failed; its retry {when}"
        if t.slot == "retry"
        else f"delayed: it {when}"
    )
    return text + (f"; even then it does not start while {blocker}" if blocker else "")


def _task_waiting(t: TaskDetails, blocker: str | None, alive: int | None) -> str:
    """A queued task: what holds it, what goes before it in its group, or
    that it waits for a free consumer."""
    now = t.now
    before = ""
    if t.position == 1:
        before = "; 1 task of its group goes before it"
    elif t.position:
        before = f"; {t.position} tasks of its group go before it"
    if blocker is not None:
        return f"it does not start while {blocker}{before}"
    if t.slot == "held":
        return f"its group's rate limit is used up: it may start {_in(now, t.due_at)}"
    if t.slot == "line":
        return f"waits in its group's line{before}"
    nobody = "; no consumer is alive" if alive == 0 else ""
    return (
        f"runnable since {_ago(now, t.runnable_since)} and waits for a free "
        f"consumer{nobody}"
    )
