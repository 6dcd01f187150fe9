"""A journal of handler runs in this process, and the group-order check."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ..task import current_task
from ._errors import GroupOrderError
from ._wrap import wrap_handler

if TYPE_CHECKING:
    from .._work.handlers import Handler, HandlerFunc


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

    def record(self, event: Literal["start", "end"], *, ok: bool = True) -> None:
        """Record an event of the task whose handler runs in this context
        (what the wrappers call).

        :raises RuntimeError: outside a handler
        """
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

    def started(self) -> None:
        self.journal.record("start")

    def ended(self, result: Any, error: BaseException | None) -> None:
        self.journal.record("end", ok=error is None)


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
    latest: dict[str, JournalEntry] = {}  # the group's latest start
    running: defaultdict[str, dict[str, JournalEntry]] = defaultdict(dict)
    for entry in sorted(entries, key=lambda e: e.seq):
        group = entry.group
        if group is None:
            continue
        if entry.event == "end":
            running[group].pop(entry.task_id, None)
            continue
        where = f"group {group!r}: task {entry.task_id!r} (attempt {entry.attempt})"
        if entry.task_id not in position:
            problems.append(f"{where} started but is not among the enqueued ids")
            continue
        problems.extend(
            f"{where} started at event {entry.seq} while task "
            f"{other.task_id!r}, started at event {other.seq}, was still running"
            for other in running[group].values()
        )
        previous = latest.get(group)
        if previous is not None and position[entry.task_id] < position.get(
            previous.task_id, -1
        ):
            problems.append(
                f"{where}, enqueued #{position[entry.task_id]}, started at event "
                f"{entry.seq} after task {previous.task_id!r}, enqueued "
                f"#{position[previous.task_id]}, had started at event {previous.seq}"
            )
        if previous is None or position[entry.task_id] >= position[previous.task_id]:
            latest[group] = entry
        running[group][entry.task_id] = entry
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
