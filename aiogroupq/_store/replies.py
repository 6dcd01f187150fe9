"""What the Lua scripts answer besides their data, and the one place that
turns an answer into the error a user sees.

Codes: ``finish.lua`` answers one :class:`FinishCode` per outcome,
``heartbeat.lua`` one :class:`HeartbeatCode` per lease, ``cancel.lua`` one
:class:`CancelCode`. Their values are the integers the Lua returns. Codes of
different scripts share values (0 is a lost lease, a lost task and an
unknown one), so a code is only ever compared with members of its own
script's enum, and :func:`public_error` looks codes up by their enum too.

Refusals: a script that will not do what it was asked answers with an error
reply starting ``aiogroupq``, having written nothing. :func:`refusal` reads
the ones a caller acts on (enqueue's, which routing may send again) into a
:class:`Refusal`; :func:`public_error` turns a refusal, a code, or a
``corrupt`` or out-of-memory error reply into an :mod:`aiogroupq.errors`
error, with the messages users see.

Replies carry bytes that anything with access to Redis may have written:
:func:`text` decodes them for display leniently, never raising.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any, Final, overload

from redis.exceptions import OutOfMemoryError, ResponseError

from ..errors import (
    AiogroupqError,
    CorruptQueueError,
    GroupFullError,
    NotReplicatedError,
    QueueFullError,
    TaskNotFoundError,
)


class FinishCode(IntEnum):
    """``finish.lua``'s answer for one outcome."""

    #: refused: the fencing token no longer owns the task, or its lease
    #: expired (even if no claim has recovered it yet); nothing changed
    LEASE_LOST = 0
    APPLIED = 1
    #: already applied by an earlier call with this token (a re-sent batch)
    DUPLICATE = 2
    #: applied as "cancel": a cancellation was requested before this outcome
    APPLIED_AS_CANCEL = 3
    #: applied to the task alone: a key of its group is damaged, so the task
    #: ended (a failure dead-lettered as corrupt) and the group was left as is
    GROUP_DAMAGED = 4
    #: refused: the task's hash is damaged
    TASK_DAMAGED = 5


class HeartbeatCode(IntEnum):
    """``heartbeat.lua``'s answer for one lease."""

    #: the token no longer owns a running task (its lease expired, it was
    #: taken, or its hash is damaged): the handler must stop
    LOST = 0
    ALIVE = 1
    #: extended, and a cancellation was requested (``Producer.cancel``)
    CANCEL_REQUESTED = 2


class CancelCode(IntEnum):
    """``cancel.lua``'s answer."""

    NOT_FOUND = 0
    #: cancelled where it waited (or already cancelled: a re-sent call)
    CANCELLED = 1
    #: running: its consumer cancels the handler at its next heartbeat
    REQUESTED = 2
    #: it had already ended otherwise, and was left alone
    FINISHED = 3


#: each code's member by its value, for the replies read for every task
#: (a lookup costs a fifth of an enum call)
FINISH_CODES: Final = {code.value: code for code in FinishCode}
HEARTBEAT_CODES: Final = {code.value: code for code in HeartbeatCode}


#: the id ``enqueue.lua`` answers for a task whose group moved to its new
#: partition (nothing written for it: the producer sends it there)
MOVED: Final = ">"
#: the state ``statuses.lua`` answers for a key that is not a task hash
NOT_A_TASK: Final = "!"


class Refusal(Exception):
    """A script's refusal that its caller acts on; nothing was written."""


class GroupFullRefusal(Refusal):
    """``enqueue.lua`` refused the batch: task *index* would take its group
    over its cap."""

    def __init__(self, index: int, live: int, cap: int) -> None:
        super().__init__(index, live, cap)
        self.index, self.live, self.cap = index, live, cap


class GroupCorruptRefusal(Refusal):
    """``enqueue.lua`` refused the batch: a key of task *index*'s group is
    damaged."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class StaleLayoutRefusal(Refusal):
    """``enqueue.lua`` refused the batch: a task does not belong in this
    partition under the layout it holds (*stored*, e.g. ``"8"`` or
    ``"8>12"``); the producer reads the layout again and routes anew."""

    def __init__(self, stored: str) -> None:
        super().__init__(stored)
        self.stored = stored


class NotReplicatedRefusal(Refusal):
    """The writes were made on the primary, but fewer replicas than asked
    acknowledged them in time. Unlike the others, it was written: *ids* are
    what the script answered (the tasks' ids, or a heartbeat's codes)."""

    def __init__(self, ids: list[str], acked: int) -> None:
        super().__init__(ids, acked)
        self.ids, self.acked = ids, acked


def refusal(exc: ResponseError) -> Refusal | None:
    """The refusal an ``enqueue.lua`` error reply stands for, or None."""
    words = str(exc).split()
    if words[:2] == ["aiogroupq", "group-full"]:
        index, live, cap = map(int, words[2:5])
        return GroupFullRefusal(index, live, cap)
    if words[:2] == ["aiogroupq", "group-corrupt"]:
        return GroupCorruptRefusal(int(words[2]))
    if words[:2] == ["aiogroupq", "stale"]:
        return StaleLayoutRefusal(" ".join(words[2:3]))
    return None


#: the public error of each code that is one, by (its script's enum, code)
_CODE_ERRORS: Final[
    Mapping[tuple[type[IntEnum], int], Callable[[str], AiogroupqError]]
] = {
    (CancelCode, CancelCode.NOT_FOUND): TaskNotFoundError,
}

_CORRUPT: Final = "aiogroupq corrupt "

Reply = ResponseError | Refusal | FinishCode | HeartbeatCode | CancelCode
"""What :func:`public_error` reads: an error reply, a refusal, or a code."""


@overload
def public_error(
    reply: GroupFullRefusal | GroupCorruptRefusal | NotReplicatedRefusal,
    subject: str = "",
    *,
    replicas: int = 0,
) -> AiogroupqError: ...
@overload
def public_error(
    reply: Reply, subject: str = "", *, replicas: int = 0
) -> AiogroupqError | None: ...
def public_error(
    reply: Reply, subject: str = "", *, replicas: int = 0
) -> AiogroupqError | None:
    """The :mod:`aiogroupq.errors` error a script's *reply* stands for, None
    if it stands for none (a success, or a refusal its caller handles).

    :param subject: what the call was about, named in the message: the task
        id (a code of ``cancel.lua``), the group
        (:class:`GroupFullRefusal`), the damaged group's key
        (:class:`GroupCorruptRefusal`)
    :param replicas: the replicas asked for (:class:`NotReplicatedRefusal`)
    """
    if isinstance(reply, IntEnum):
        make = _CODE_ERRORS.get((type(reply), reply))
        return None if make is None else make(subject)
    if isinstance(reply, GroupFullRefusal):
        return GroupFullError(subject, reply.live, reply.cap)
    if isinstance(reply, GroupCorruptRefusal):
        return CorruptQueueError(subject, "a key of this group is damaged")
    if isinstance(reply, NotReplicatedRefusal):
        return NotReplicatedError(reply.ids, reply.acked, replicas)
    if isinstance(reply, OutOfMemoryError):  # refused before it ran
        return QueueFullError(str(reply))
    if isinstance(reply, ResponseError) and str(reply).startswith(_CORRUPT):
        key, _, detail = str(reply)[len(_CORRUPT) :].partition(": ")
        return CorruptQueueError(key, detail)
    return None


def text(value: Any) -> str:
    """A reply's stored bytes as text for display; invalid UTF-8 shows as
    U+FFFD."""
    if isinstance(value, str):
        return value
    return bytes(value).decode(errors="replace")
