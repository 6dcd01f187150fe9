"""What :func:`~aiogroupq.testing.drain` reports per task.

A module of its own so that the errors (``DrainTimeoutError`` carries the
outcomes so far) and the drain itself both use it without importing each
other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..task import TaskState


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """What became of one task that :func:`drain` touched.

    :ivar id: the task id
    :ivar type: its task type
    :ivar group: its group, or ``None``
    :ivar state: its state in Redis when the drain ended (``None``: gone)
    :ivar attempts: the highest attempt number its handler ran with (for a
        task dead-lettered before its handler ran: the attempts counted)
    :ivar result: what the handler returned on its last run
    :ivar error: the exception its handler raised on its last run (an
        :class:`aiogroupq.Retry` included), or ``None``
    :ivar reason: the dead-letter reason, for a dead task
    """

    id: str
    type: str
    group: str | None
    state: TaskState | None
    attempts: int
    result: Any = None
    error: BaseException | None = None
    reason: str | None = None
