"""A journal of handler runs in this process, and the group-order check.

:class:`GroupWatch` is the one group-order checker of the project: the public
:func:`assert_group_order`, the ``aiogroupq demo`` verification and the test
suite's journals all judge their events with it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..task import TaskInfo, current_task
from ._errors import GroupOrderError
from ._wrap import wrap_handler

if TYPE_CHECKING:
    from .._work.handlers import Handler, HandlerFunc

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One start or end of a handler run.

    :ivar seq: position in the journal, from 0 (the event loop runs one
        coroutine at a time, so this orders every event of the process)
    :ivar event: ``"start"`` or ``"end"``
    :ivar task_id: the task's id
    :ivar type: its task type
    :ivar group: its group, or ``None``
    :ivar attempt: the attempt number of this run
    :ivar ok: for an end: whether the handler returned (it raised, or was
        cancelled, otherwise); always True for a start
    """

    seq: int
    event: Literal["start", "end"]
    task_id: str
    type: str
    group: str | None
    attempt: int
    ok: bool = True


class Journal:
    """Records every start and end of the handlers it wraps, for
    :func:`assert_group_order`.

    Wrap the handlers you give a consumer (or :func:`drain`) running in this
    process::

        journal = Journal()
        await drain(redis, queue="q", handlers=journal.wrap_handlers(HANDLERS))
        assert_group_order(journal, enqueued=ids)
    """

    def __init__(self) -> None:
        #: the events, in the order they happened
        self.entries: list[JournalEntry] = []

    def wrap(self, handler: HandlerFunc | Handler) -> Handler:
        """*handler*, journaled (its options and payload type kept)."""
        return wrap_handler(handler, _Hooks(self))

    def wrap_handlers(
        self, handlers: Mapping[str, HandlerFunc | Handler]
    ) -> dict[str, Handler]:
        """Every handler of a ``handlers`` mapping, journaled."""
        return {name: self.wrap(handler) for name, handler in handlers.items()}

    def record(
        self,
        event: Literal["start", "end"],
        *,
        ok: bool = True,
        info: TaskInfo | None = None,
    ) -> None:
        """Record an event of *info*'s task, by default the one whose handler
        runs in this context (what the wrappers call, with each task of a
        batch's *info*).

        :raises RuntimeError: outside a handler, without *info*
        """
        if info is None:
            info = current_task()
        self.entries.append(
            JournalEntry(
                len(self.entries),
                event,
                info.id,
                info.type,
                info.group,
                info.attempt,
                ok,
            )
        )

    def started(self, group: str | None = None) -> list[str]:
        """Task ids in the order their handlers started (repeats included),
        optionally of one group only."""
        return [
            e.task_id
            for e in self.entries
            if e.event == "start" and (group is None or e.group == group)
        ]

    def problems(self, enqueued: Iterable[str]) -> list[str]:
        """What :func:`assert_group_order` would complain about, one sentence
        per violation (empty if none)."""
        return group_order_problems(self.entries, enqueued)


class _Hooks:
    __slots__ = ("journal",)

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def started(self, info: TaskInfo) -> None:
        self.journal.record("start", info=info)

    def ended(self, info: TaskInfo, result: Any, error: BaseException | None) -> None:
        self.journal.record("end", ok=error is None, info=info)


@dataclass(frozen=True, slots=True)
class Reached(Generic[R]):
    """The furthest a group's starts have got in its enqueue order.

    :ivar position: the furthest position that started
    :ivar run: the latest run that started it
    """

    position: int
    run: R


class GroupWatch(Generic[K, R]):
    """The group invariants, followed event by event along a journal.

    Every journal checker (:func:`assert_group_order`, the ``aiogroupq demo``
    verification, and those of the project's own tests) walks its events
    through one of these, in the order they happened, and decides what each
    finding means for its journal:

    - at a start, :meth:`open` returns the runs of its group that are still
      open: a group runs one task at a time, so any of them is an overlap;
    - :meth:`place` returns how far the group's starts had got in enqueue
      order: a start behind that is out of order (a task never starts after
      a later task of its group has started; a retry of the furthest task is
      in order);
    - at an end, :meth:`close` closes the run it ends.

    A run is known by a key of the caller's choosing, whatever its end event
    carries (a task id; a task, attempt and process). One run per key is
    open at a time: a start of a key that is open replaces its run (having
    been told of the overlap), and an end closes its key's run. Ungrouped
    runs (group ``None``) are followed too, for the caller's concurrency
    figures, but have no order.
    """

    def __init__(self) -> None:
        self._open: dict[str | None, dict[K, R]] = {}
        self._reached: dict[str, Reached[R]] = {}
        #: how many runs are open, of every group and ungrouped
        self.open_count = 0

    def open(self, group: str | None, key: K, run: R) -> list[R]:
        """Note the start of *run*; return the runs of *group* (``None``:
        the ungrouped ones) that were open when it started."""
        runs = self._open.setdefault(group, {})
        others = list(runs.values())
        if key not in runs:
            self.open_count += 1
        runs[key] = run
        return others

    def close(self, group: str | None, key: K) -> R | None:
        """Note an end: close the open run of *group* under *key* and return
        it (``None``: none is open, an end that the journal cannot place)."""
        run = self._open.get(group, {}).pop(key, None)
        if run is not None:
            self.open_count -= 1
        return run

    def place(self, group: str, position: int, run: R) -> Reached[R] | None:
        """Note that *run* started the task at *position* of *group*'s
        enqueue order; return how far the group's starts had got before it
        (``None``: this is the group's first start). The start is out of
        order if *position* is below the returned one."""
        reached = self._reached.get(group)
        if reached is None or position >= reached.position:
            self._reached[group] = Reached(position, run)
        return reached


def group_order_problems(
    entries: Sequence[JournalEntry], enqueued: Iterable[str]
) -> list[str]:
    """Check that, within each group, handlers started in enqueue order (a
    retried task may run again, but never after a later task of its group
    started) and never ran two at a time.

    :param entries: journal events, in the order they happened
    :param enqueued: the ids of the grouped tasks in enqueue order (e.g. the
        ids ``enqueue_many`` returned); ungrouped tasks are ignored
    """
    position = {task_id: at for at, task_id in enumerate(enqueued)}
    problems: list[str] = []
    watch: GroupWatch[str, JournalEntry] = GroupWatch()
    for entry in sorted(entries, key=lambda e: e.seq):
        group = entry.group
        if group is None:
            continue
        if entry.event == "end":
            watch.close(group, entry.task_id)
            continue
        where = f"group {group!r}: task {entry.task_id!r} (attempt {entry.attempt})"
        at = position.get(entry.task_id)
        if at is None:
            problems.append(f"{where} started but is not among the enqueued ids")
            continue
        problems.extend(
            f"{where} started at event {entry.seq} while task "
            f"{other.task_id!r}, started at event {other.seq}, was still running"
            for other in watch.open(group, entry.task_id, entry)
        )
        reached = watch.place(group, at, entry)
        if reached is not None and at < reached.position:
            problems.append(
                f"{where}, enqueued #{at}, started at event {entry.seq} after "
                f"task {reached.run.task_id!r}, enqueued #{reached.position}, "
                f"had started at event {reached.run.seq}"
            )
    return problems


def assert_group_order(
    journal: Journal | Sequence[JournalEntry], *, enqueued: Iterable[str]
) -> None:
    """Assert that each group's tasks started in enqueue order and never
    overlapped.

    :param journal: a :class:`Journal`, or its entries
    :param enqueued: the ids of the grouped tasks in enqueue order
    :raises GroupOrderError: (an ``AssertionError``) listing every violation
    """
    entries = journal.entries if isinstance(journal, Journal) else journal
    problems = group_order_problems(entries, enqueued)
    if problems:
        raise GroupOrderError(problems)
