"""Start estimates (:meth:`Admin.estimate`): when a waiting task is expected
to start, from its place in line and the queue's recent start rate.

The rate comes from a small rolling counter the claims keep
(``{aiogroupq:<q>}:starts``, a field per second of server time holding that
second's starts, the last :data:`STARTS_WINDOW` seconds), never from a scan. The
claims keep it only once the queue's ``conf`` has ``est``, which the first
estimate asked of a queue sets (on every partition), so a queue that never
asks pays nothing; that first estimate, and any asked before a second of
starts was counted, is ``None`` ("no samples yet").

The model, for a task of partition *p* whose counter says *R* starts per
second, in a queue whose leases say *n* tasks are claimed and not finished
while its counters say *Q* starts per second (so, by Little's law, a slot
is held ``n / Q`` seconds per task):

- a task in the ready line (ungrouped, or its group's next) at index *i*
  starts after the *i* entries before it: ``i / R`` from now. With
  priorities the index counts the higher levels first (a task of higher
  priority enqueued later still goes ahead: the estimate cannot know);
- a task in its group's line waits for its group's slots: each slot frees
  when its task has run (``n / Q``), and the next task of the line then
  joins the ready line's tail, behind what is left of the ready line then
  (with fairness ``"drain"``, or during a weighted group's turns at the
  front, ahead of it), and within the group's rate limit. A step-by-step
  run of that, slot by slot, gives its start; it is *group limited* when the
  group's own pace (slots, rate) decides rather than the ready line;
- a delayed task starts no sooner than its due time: it then joins the
  ready line's tail (or its group's line);
- a retry waiting out its backoff goes first in its group when due; a
  group's next task held by its rate starts when the rate frees.

Tasks enqueued from now on are assumed not to go ahead of it (they go to the
tail), except as priorities and fairness say above. A partition's position
is in its own lines, and its own rate is used: the queue's rate (the sum
over partitions) is given beside it.
"""

from __future__ import annotations

__all__ = (
    "BOUND",
    "Explained",
    "StartEstimate",
    "explain",
    "shown",
)

import heapq
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redis.exceptions import NoPermissionError, ResponseError

from .._limits import STARTS_WINDOW
from .._store.scripts import estimate_facts
from .._store.wrongtype import corrupt_key, is_wrong_type
from ..errors import AiogroupqError
from .raw import as_int as _int, opt_text as _opt_text

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.partition import Partitions
    from .views import TaskDetails

logger = logging.getLogger(__name__)

#: entries of a list looked through for a task (the ready line, a group's
#: line): one native ``LPOS``, no loop in Lua; a task further back gets no
#: estimate
BOUND: Final = 10_000
#: seconds of counted starts an estimate needs at least
MIN_SPAN: Final = 0.5


@dataclass(frozen=True, slots=True)
class StartEstimate:
    """When a waiting task is expected to start (:meth:`Admin.estimate`).

    Times are Unix seconds on the Redis server's clock, like the views'.

    :ivar task_id: the task
    :ivar starts_at: when it is expected to start (be claimed)
    :ivar now: the server's clock when it was estimated
    :ivar position: tasks that start before it: its index in the ready
        line, or, for a task waiting in its group's order, the tasks of its
        group before it (as :meth:`Admin.position`); in its partition
    :ivar rate_per_s: the starts per second of its partition, over the
        counted seconds, that the estimate used
    :ivar queue_rate_per_s: the queue's starts per second (all partitions)
    :ivar samples: the starts counted (its partition) over *span*
    :ivar span: seconds of counted starts the rate is taken over (at most
        30)
    :ivar group_limited: its group's concurrency or rate limit, rather than
        the queue's ready line, is what it waits for
    :ivar basis: one sentence: what the estimate rests on
    """

    task_id: str
    starts_at: float
    now: float
    position: int
    rate_per_s: float
    queue_rate_per_s: float
    samples: int
    span: float
    group_limited: bool
    basis: str

    @property
    def wait(self) -> float:
        """Seconds from :attr:`now` to :attr:`starts_at` (0 if overdue)."""
        return max(0.0, self.starts_at - self.now)


@dataclass(frozen=True, slots=True)
class Explained:
    """An estimate, or why there is none."""

    estimate: StartEstimate | None
    reason: str


@dataclass(frozen=True, slots=True)
class _Rate:
    per_s: float
    samples: int
    span: float


def _rate(now_ms: int, starts: Any) -> _Rate | None:
    """The start rate of a counter read ``[this second, the one before, ...]``.

    The oldest second with starts is left out, since its starts may have
    begun anywhere in it; the rate runs from its end to now. ``None`` until
    :data:`MIN_SPAN` of such history exists.
    """
    if not isinstance(starts, list):
        return None
    counts = [_int(n) for n in starts]
    oldest = max((i for i, n in enumerate(counts) if n > 0), default=0)
    if oldest == 0:
        return None
    span = (now_ms % 1000) / 1000 + oldest - 1
    samples = sum(counts[:oldest])
    if span < MIN_SPAN or samples <= 0:
        return None
    return _Rate(samples / span, samples, span)


@dataclass(frozen=True, slots=True)
class _Group:
    k: int
    limit: int
    line: int
    rn: int
    rp_ms: int
    paused: bool
    halted: str | None
    weight: int
    rate_free_ms: int | None
    recent_ms: list[int]
    holders: list[tuple[str, int | None]]


def _group(raw: Any) -> _Group | None:
    if not isinstance(raw, list) or len(raw) < 11:
        return None
    holders = [
        (_opt_text(h[0]) or "", None if h[1] is None else _int(h[1]))
        for h in raw[10]
        if isinstance(h, list) and len(h) >= 2
    ]
    return _Group(
        k=_int(raw[0]),
        limit=max(1, _int(raw[1], 1)),
        line=_int(raw[2]),
        rn=_int(raw[3]),
        rp_ms=_int(raw[4]),
        paused=raw[5] == 1,
        halted=_opt_text(raw[6]),
        weight=max(1, _int(raw[7], 1)),
        rate_free_ms=None if raw[8] is None else _int(raw[8]),
        recent_ms=[_int(t) for t in raw[9] or ()],
        holders=holders,
    )


@dataclass(frozen=True, slots=True)
class _Line:
    """The partition's state an estimate runs on (times in seconds)."""

    now: float
    rate: float  # starts per second
    hold: float  # seconds a claimed task holds its slot
    ready: int  # entries of the ready line
    drain: bool  # fairness "drain": a group's next task goes to the front

    def ready_wait(self, at: float) -> float:
        """Seconds a task joining the ready line's tail at *at* waits: what
        is left then of today's ready line, at the rate."""
        left = self.ready - self.rate * (at - self.now)
        return max(0.0, left) / self.rate


def _in_group(
    line: _Line, g: _Group, index: int, due: float | None
) -> tuple[float, bool]:
    """When the task at *index* of its group's line starts (due at *due*,
    if delayed), and whether the group's pace decided it: the group's slots
    run slot by slot, each line task taking the first to free."""
    now, rate, hold = line.now, line.rate, line.hold
    rn, rp = g.rn, g.rp_ms / 1000
    starts: deque[float] = deque((t / 1000 for t in g.recent_ms), maxlen=rn or 1)
    free: list[float] = []
    described = 0
    for mark, value in g.holders:
        described += 1
        if mark == "@":  # waits in the ready line at its place
            place = line.ready / 2 if value is None or value < 0 else value
            begin = now + place / rate
        elif mark == "r":  # a retry: first in line when due
            begin = max(now, value / 1000) if value is not None else now
        elif mark == "~":  # held: by the rate
            free_at = g.rate_free_ms
            begin = max(now, free_at / 1000) if free_at is not None else now
        else:  # running: half its hold left, on average
            free.append(now + hold / 2)
            continue
        starts.append(begin)
        free.append(begin + hold)
    free += [now + hold / 2] * max(0, g.k - described)  # not described: running
    free.sort()
    if len(free) > g.limit:  # a lowered concurrency: the first ends free none
        free = free[len(free) - g.limit :]
    free += [now] * (g.limit - len(free))
    heapq.heapify(free)
    turn, begin, limited = 0, now, True
    for j in range(index + 1):
        at = heapq.heappop(free)
        if j == index and due is not None:
            at = max(at, due)
        front = line.drain or (g.weight > 1 and turn < g.weight - 1)
        turn = (turn + 1) % g.weight
        wait = 0.0 if front else line.ready_wait(at)
        begin = at + wait
        limited = wait == 0.0
        if rn and len(starts) == rn and starts[0] + rp > begin:
            begin, limited = starts[0] + rp, True
        starts.append(begin)
        heapq.heappush(free, begin + hold)
    return begin, limited


def _estimate(
    task_id: str, reply: Any, rate: _Rate, queue_rate: float, running: int
) -> Explained:
    """The estimate of one task from its partition's ``estimate.lua`` reply;
    *running*: the tasks claimed and not finished in every partition."""
    now_ms, _, _, _, ready, queue_paused, drain, task = reply
    now = _int(now_ms) / 1000
    if not isinstance(task, list):
        return Explained(None, "no such task (or it expired)")
    state, group, due_ms, mark, at_ready, at_line, facts = task
    state_text = _opt_text(state) or ""
    if state_text not in ("queued", "delayed"):
        return Explained(None, f"it is {state_text}, not waiting")
    if queue_paused == 1:
        return Explained(None, "the queue is paused")
    line = _Line(
        now=now,
        rate=rate.per_s,
        # Little's law over the whole queue: a partition's own count swings
        # with each batch its consumers claim.
        hold=max(1, running) / queue_rate,
        ready=_int(ready),
        drain=drain == 1,
    )
    due = None if due_ms is None else _int(due_ms) / 1000
    g = _group(facts) if group is not None else None
    if group is not None:
        if g is None:
            return Explained(None, "a key of its group is damaged")
        if g.paused:
            return Explained(None, "its group is paused")
        if g.halted is not None:
            return Explained(None, "its group is halted behind a dead task")

    def made(starts_at: float, position: int, limited: bool, basis: str) -> Explained:
        estimate = StartEstimate(
            task_id=task_id,
            starts_at=max(now, starts_at),
            now=now,
            position=position,
            rate_per_s=rate.per_s,
            queue_rate_per_s=queue_rate,
            samples=rate.samples,
            span=rate.span,
            group_limited=limited,
            basis=basis,
        )
        return Explained(estimate, basis)

    per_s = f"{rate.per_s:.1f} starts/s over the last {rate.span:.0f}s"
    mark_text = _opt_text(mark)
    if g is None or mark_text == "@":
        if state_text == "delayed":
            at = max(now, due or now)
            ahead = max(0, round(line.ready - line.rate * (at - now)))
            return made(
                at + line.ready_wait(at),
                ahead,
                False,
                f"due, then behind {ahead} in the ready line at {per_s}",
            )
        place = None if at_ready is None else _int(at_ready)
        if place is None:
            return Explained(None, "it is not in the ready line (it may have started)")
        if place < 0:
            return Explained(None, f"more than {BOUND:,} tasks are ahead of it")
        return made(
            now + place / line.rate,
            place,
            False,
            f"{place} ahead in the ready line at {per_s}",
        )
    if mark_text == "r":
        return made(due or now, 0, True, "its retry goes first in its group when due")
    if mark_text == "~":
        free_at = g.rate_free_ms / 1000 if g.rate_free_ms is not None else now
        return made(free_at, 0, True, "its group's rate limit frees a start then")
    if mark_text is not None:
        return Explained(None, "it is starting")
    if state_text == "delayed":
        index = g.line
    else:
        if at_line is None:
            return Explained(None, "it is not in its group's line (it may have moved)")
        index = _int(at_line)
        if index < 0:
            return Explained(
                None, f"more than {BOUND:,} tasks of its group are ahead of it"
            )
        due = None
    starts_at, limited = _in_group(line, g, index, due)
    pace = "its group's pace" if limited else "the ready line"
    return made(
        starts_at,
        g.k + index,
        limited,
        f"{g.k + index} of its group before it (concurrency {g.limit}"
        + (f", rate {g.rn} per {g.rp_ms / 1000:g}s" if g.rn else "")
        + f"), {pace} deciding, at {per_s}",
    )


async def _switch_on(client: Client, conf_key: str) -> bool:
    """Set conf ``est`` so that the claims count starts; False if this
    client may not write it (a read-only user: the estimate stays off)."""
    try:
        await client.hset(conf_key, "est", "1")
    except NoPermissionError:
        return False
    except ResponseError as exc:
        if not is_wrong_type(exc):
            raise
        raise await corrupt_key(
            client, conf_key, "hash", "the queue's settings cannot be read"
        ) from None
    return True


async def explain(
    client: Client, parts: Partitions, task_id: str, switch_on: bool = True
) -> Explained:
    """The estimate of *task_id*, or why there is none. With *switch_on*,
    the first one asked of a queue switches its counter on (every
    partition)."""
    mine = parts.of_id(task_id)
    reply = await estimate_facts(
        client, mine, task_id, bound=BOUND, window=STARTS_WINDOW
    )
    replies = [(mine, reply)]
    for keys in parts.all():
        if keys.prefix != mine.prefix:
            other = await estimate_facts(
                client, keys, "", bound=BOUND, window=STARTS_WINDOW
            )
            replies.append((keys, other))
    allowed = True
    for keys, r in replies:
        if r[1] != 1 and switch_on:
            allowed = await _switch_on(client, keys.conf) and allowed
    rates = [_rate(_int(r[0]), r[2]) for _, r in replies]
    own = rates[0]
    if reply[1] != 1:
        why = "no samples yet: the start counter was off, and is on now"
        if not switch_on:
            why = COUNTER_OFF
        elif not allowed:
            why = "the start counter is off, and this client may not switch it on"
        return Explained(None, why)
    if reply[2] is None:
        return Explained(None, "the start counter key is damaged (aiogroupq check)")
    if own is None:
        return Explained(None, "no samples yet: no starts counted in the last 30s")
    queue_rate = sum(r.per_s for r in rates if r is not None)
    running = sum(_int(r[3]) for _, r in replies)
    explained = _estimate(task_id, reply, own, queue_rate, running)
    logger.debug("estimate of task %s: %s", task_id, explained.reason)
    return explained


#: why a task's page shows no estimate on a queue that never asked for one
COUNTER_OFF: Final = (
    "estimates are off for this queue: the first Admin.estimate() switches "
    "its start counter on"
)


async def shown(
    explain: Callable[[str], Awaitable[Explained]], details: TaskDetails
) -> StartEstimate | str | None:
    """For the pages of a task (CLI, dashboard): the estimate of a waiting
    task, or why there is none; ``None`` for a running or ended task. Pages
    only read: *explain* leaves the counter as it is. An error of
    aiogroupq's (a refused command, a damaged key) is shown as the reason,
    never raised: the page still shows the task."""
    if details.state not in ("queued", "delayed"):
        return None
    try:
        found = await explain(details.id)
    except AiogroupqError as exc:
        return f"not available: {exc}"
    return found.estimate or found.reason
