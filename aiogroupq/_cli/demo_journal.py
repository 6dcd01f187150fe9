"""The demo's journal: where its workers write it, the Lua call that writes
a record, and the verification that reads it back against the plan, then
says the figures and the result."""

from __future__ import annotations

__all__ = ("JOURNAL_LUA", "Verdict", "conclude", "journal_keys", "verify")

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from ..testing._journal import GroupWatch

if TYPE_CHECKING:
    from .demo_plan import Job

# One atomic step: a clock tick, the server time, and the record. Its keys
# share a hash tag outside the queue's own ``{aiogroupq:<queue>}`` prefix.
JOURNAL_LUA: Final = """
local clock = redis.call('INCR', KEYS[1])
local now = redis.call('TIME')
redis.call('RPUSH', KEYS[2], clock .. ' ' .. now[1] .. ' ' .. now[2] .. ' ' .. ARGV[1])
if ARGV[2] == 'e' then redis.call('INCR', KEYS[3]) end
return clock
"""


def journal_keys(queue: str) -> tuple[str, str, str]:
    """The clock, journal and done-counter keys of a demo queue."""
    tag = f"{{aiogroupq-demo:{queue}}}"
    return f"{tag}:clock", f"{tag}:journal", f"{tag}:done"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the journal shows.

    :ivar ran: tasks that started at least once
    :ivar ran_twice: tasks that started more than once
    :ivar never_ran: tasks that never started
    :ivar unfinished: tasks whose starts and ends do not pair up
    :ivar order_violations: starts of a group's task after a later task of the
        group had started (or journal records that do not match the plan)
    :ivar overlaps: starts of a group's task while another one of it ran
    :ivar span_s: first start to last end, on the server's clock
    """

    ran: int
    ran_twice: int
    never_ran: int
    unfinished: int
    order_violations: int
    overlaps: int
    span_s: float

    @property
    def ok(self) -> bool:
        """Every task ran exactly once, in order, one at a time per group."""
        counts = (self.ran_twice, self.never_ran, self.unfinished)
        return not any((*counts, self.order_violations, self.overlaps))


def verify(jobs: Sequence[Job], journal: Sequence[bytes | str]) -> Verdict:
    """Check the journal against the plan.

    :param jobs: the plan, in enqueue order
    :param journal: records ``clock sec usec event i seq attempt group``
    """
    starts: Counter[int] = Counter()
    ends: Counter[int] = Counter()
    order = overlaps = 0
    watch: GroupWatch[int, int] = GroupWatch()
    first_us = last_us = 0
    records = [
        (raw.decode() if isinstance(raw, bytes) else raw).split(" ", 7)
        for raw in journal
    ]
    for _clock, sec, usec, event, i_, seq_, _attempt, group_ in sorted(
        records, key=lambda r: int(r[0])
    ):
        i, seq, at_us = int(i_), int(seq_), int(sec) * 1_000_000 + int(usec)
        group = None if group_ == "-" else group_
        if not 0 <= i < len(jobs) or (jobs[i].group, jobs[i].seq) != (group, seq):
            order += 1  # a record the plan does not know: a corrupt payload
            continue
        if event == "e":
            ends[i] += 1
            last_us = max(last_us, at_us)
            if group is not None:
                watch.close(group, i)
            continue
        starts[i] += 1
        first_us = at_us if not first_us else min(first_us, at_us)
        if group is None:
            continue
        if watch.open(group, i, i):
            overlaps += 1
        reached = watch.place(group, seq, i)
        if reached is not None and seq < reached.position:
            order += 1
    return Verdict(
        ran=len(starts),
        ran_twice=sum(1 for n in starts.values() if n > 1),
        never_ran=len(jobs) - len(starts),
        unfinished=sum(1 for i in range(len(jobs)) if starts[i] != ends[i]),
        order_violations=order,
        overlaps=overlaps,
        span_s=max(0, last_us - first_us) / 1_000_000,
    )


def conclude(
    jobs: Sequence[Job],
    journal: Sequence[bytes | str],
    states: Counter[str],
    elapsed: float,
    checks: Sequence[tuple[bool, str]],
    say: Callable[[str], None],
) -> int:
    """Verify the journal, say the figures and the result; return the exit
    status (0 if every check holds).

    :param states: every task's final state, counted
    :param elapsed: first enqueue to last end, in seconds
    :param checks: more conditions of success, each with what it means when
        it fails
    """
    verdict = verify(jobs, journal)
    _report(verdict, len(jobs), states, elapsed, say)
    problems = [
        text
        for ok, text in (
            *checks,
            (verdict.ok, "the journal shows violations"),
            (states == {"succeeded": len(jobs)}, "not every task succeeded"),
        )
        if not ok
    ]
    say("result:   " + ("FAILED: " + "; ".join(problems) if problems else "OK"))
    return 1 if problems else 0


def _report(
    verdict: Verdict,
    total: int,
    states: Counter[str],
    elapsed: float,
    say: Callable[[str], None],
) -> None:
    rate = verdict.ran / verdict.span_s if verdict.span_s else 0.0
    span = f"{verdict.span_s:.2f} s"
    for label, value in (
        ("tasks run", f"{verdict.ran:,} of {total:,}"),
        ("tasks run more than once", f"{verdict.ran_twice:,}"),
        ("tasks never run", f"{verdict.never_ran:,}"),
        ("unfinished runs", f"{verdict.unfinished:,}"),
        ("order violations", f"{verdict.order_violations:,}"),
        ("overlapping runs", f"{verdict.overlaps:,}"),
        ("final states", ", ".join(f"{k} {n:,}" for k, n in sorted(states.items()))),
        ("throughput", f"{rate:,.0f} tasks/s (first start to last end: {span})"),
        ("elapsed", f"{elapsed:.2f} s (first enqueue to last end)"),
    ):  # fmt: skip
        say(f"{label + ':':<26}{value}")
