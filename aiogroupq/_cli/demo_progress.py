"""The demo's progress: what is left to run, followed from the journal, and
the lines that say it (the count and the rate, and once the tasks left are a
few groups', why the rate drops)."""

from __future__ import annotations

__all__ = ("Remaining", "progress_line", "tail_line")

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .demo_plan import HOT_GROUPS, is_hot

if TYPE_CHECKING:
    from .demo_plan import Job


class Remaining:
    """The tasks left to run, followed from the journal as it grows: whether
    any task has started yet, and whether every task left belongs to a few
    groups (the tail, where the rate drops because a group runs one task at
    a time).

    :param jobs: the plan, in enqueue order
    """

    def __init__(self, jobs: Sequence[Job]) -> None:
        self._jobs = jobs
        self._left: Counter[str | None] = Counter(job.group for job in jobs)
        self._ended = bytearray(len(jobs))
        #: a task has started (the journal is not empty)
        self.started = False

    def feed(self, records: Iterable[bytes | str]) -> None:
        """Take journal records (``clock sec usec event i ...``) in order."""
        for raw in records:
            self.started = True
            text = raw.decode() if isinstance(raw, bytes) else raw
            event, index = text.split(" ", 5)[3:5]
            i = int(index)
            # A repeated end or a record the plan does not know is verify()'s
            # to report; here it must not skew the counts.
            if event != "e" or not 0 <= i < len(self._jobs) or self._ended[i]:
                continue
            self._ended[i] = 1
            group = self._jobs[i].group
            self._left[group] -= 1
            if not self._left[group]:
                del self._left[group]

    @property
    def left(self) -> int:
        """Tasks not ended yet."""
        return self._left.total()

    def tail(self) -> list[str] | None:
        """The groups of the tasks left, when at most :data:`HOT_GROUPS` of
        them hold all of those (no ungrouped task left); else ``None``."""
        if not self._left or len(self._left) > HOT_GROUPS or None in self._left:
            return None
        return sorted(group for group in self._left if group is not None)


def progress_line(
    done: int, total: int, rate: float, *, started: bool, tail: Sequence[str] | None
) -> str:
    """The progress line: the count and the rate, or why there is no rate
    yet, and in the tail how many groups are left."""
    line = f"  running: {done:,}/{total:,} done"
    if not started:
        return f"{line}, waiting for the worker processes to start"
    line += f", {rate:,.0f} tasks/s"
    if tail:
        each = "one task at a time" if len(tail) == 1 else "one task at a time each"
        line += f" ({_groups(tail)} left, {each})"
    return line


def tail_line(left: int, tail: Sequence[str]) -> str:
    """Say once why the end is slower: the tasks left are a few groups'."""
    hot = "hot " if all(is_hot(group) for group in tail) else ""
    return (
        f"tail:     the last {left:,} tasks all belong to the {_groups(tail, hot)} "
        f"({', '.join(tail)}), and a group runs its tasks one at a time, by "
        f"design: the rate drops to what {len(tail)} "
        f"task{'s' if len(tail) > 1 else ''} at a time allow"
    )


def _groups(tail: Sequence[str], adjective: str = "") -> str:
    return f"{len(tail)} {adjective}group{'s' if len(tail) > 1 else ''}"
