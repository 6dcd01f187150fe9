"""Errors raised by :mod:`aiogroupq.testing`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import AiogroupqError

if TYPE_CHECKING:
    from ._outcome import TaskOutcome


class PayloadDecodeError(AiogroupqError, ValueError):
    """:func:`~aiogroupq.testing.run_inline`: the payload does not decode into
    the handler's declared type; a consumer would dead-letter the task.

    :ivar reason: the dead-letter reason a consumer would record
    """

    def __init__(self, payload: object, reason: str) -> None:
        super().__init__(f"payload {payload!r} would be dead-lettered: {reason}")
        self.payload = payload
        self.reason = reason


class ResultEncodeError(AiogroupqError, TypeError):
    """:func:`~aiogroupq.testing.run_inline`: a handler with
    ``store_result=True`` returned a value MessagePack cannot encode; a
    consumer would dead-letter the task.

    :ivar reason: the dead-letter reason a consumer would record
    """

    def __init__(self, result: object, reason: str) -> None:
        super().__init__(f"result {result!r} would be dead-lettered: {reason}")
        self.result = result
        self.reason = reason


class DrainTimeoutError(AiogroupqError, TimeoutError):
    """:func:`~aiogroupq.testing.drain`: the queue was not idle in time.

    :ivar timeout: the timeout in seconds
    :ivar backlog: what was still pending, in words
    :ivar outcomes: the tasks seen so far (states as last read)
    """

    def __init__(
        self, timeout: float, backlog: str, outcomes: list[TaskOutcome]
    ) -> None:
        super().__init__(f"the queue was not idle after {timeout!r}s: {backlog}")
        self.timeout = timeout
        self.backlog = backlog
        self.outcomes = outcomes


class GroupOrderError(AiogroupqError, AssertionError):
    """:func:`~aiogroupq.testing.assert_group_order`: a group's tasks started
    out of enqueue order, or two of them ran at once.

    :ivar problems: one sentence per violation
    """

    def __init__(self, problems: list[str]) -> None:
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"group order broken ({len(problems)} problems):\n{lines}")
        self.problems = problems
