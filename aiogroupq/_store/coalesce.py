"""One producer's enqueues, coalesced while one is on the wire.

A call that finds nothing in flight is sent at once: a lone or sequential
enqueue waits for nothing. It goes in a task of its own, which keeps the
lane busy until the call is answered even if its caller is cancelled (a
request on the wire may still run, and nothing may overtake it); or, where
the producer's sender keeps that order itself (its held connection reads a
cancelled call's reply before the next one's, ``held.py``), in the
caller's task, which saves the task and two of the event loop's turns.
Calls made while one is in flight queue up, in call order, and go
together as one script call (as many as fit in
:data:`~aiogroupq._limits.MAX_BATCH` tasks and the producer's
``max_batch_bytes``; the rest in the next) once the wire is free: 100
concurrent enqueues cost a few round trips, not 100. At most one call is in
flight, so calls reach Redis in the order they were made, and tasks of one
group keep that order.

Each call keeps its own answer. A refusal that names one task (its group is
full or damaged) goes to the call that task came from, and the others are
sent again without it (the script is atomic: nothing of the refused call was
written; a partitioned queue's parts that were written are found again by
id, as with any re-send). A failure of the whole script call goes to every
call in it, each with its own ids where the error carries ids
(:class:`~aiogroupq.OutcomeUnknownError`,
:class:`~aiogroupq.NotReplicatedError`). A call made of several tasks
(``enqueue_many``) is never split: it goes whole, or is refused whole.

A caller cancelled while its call waits is dropped before anything is sent;
one cancelled once its call was sent may or may not have its tasks written,
as with any cancelled enqueue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final

from ..errors import OutcomeUnknownError, RedisUnavailableError
from .replies import GroupCorruptRefusal, GroupFullRefusal, NotReplicatedRefusal

if TYPE_CHECKING:
    from .scripts import NewTask

#: what the sender raises about the tasks it was given (index into them)
Refusal = GroupFullRefusal | GroupCorruptRefusal | NotReplicatedRefusal
_REFUSALS: Final = (GroupFullRefusal, GroupCorruptRefusal, NotReplicatedRefusal)
#: sends tasks in one call and returns their ids
Sender = Callable[[Sequence["NewTask"]], Coroutine[Any, Any, list[str]]]


class SendElsewhere(Exception):
    """A direct sender sent nothing: the call must go the lane's own way."""


class _Call:
    """One caller's tasks, waiting for the wire."""

    __slots__ = ("future", "news", "size")

    def __init__(self, news: list[NewTask], future: asyncio.Future[list[str]]) -> None:
        self.news = news
        self.future = future
        #: what its tasks add to a script call, as enqueue_many counts it
        self.size = sum(len(new.envelope) + len(new.identity) for new in news)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)

    def answer(self, ids: list[str]) -> None:
        if not self.future.done():
            self.future.set_result(ids)


class Coalescer:
    """Sends one producer's enqueues, at most one script call at a time.

    :param send: sends tasks in one call and returns their ids; raises a
        :data:`Refusal` whose index is into the tasks it was given, or any
        failure of the call
    :param public: the public error a refusal stands for, given the tasks
        of the one call it concerns (its index is into them)
    :param max_tasks: the most tasks one coalesced script call carries
    :param max_bytes: the most bytes of envelopes one coalesced call carries
        (a single call larger than that still goes, alone)
    :param direct: gives, for a lone call, a sender that may run in its
        caller's task (a cancelled call on it can be overtaken by no later
        one), or None; such a sender raises :class:`SendElsewhere`, having
        sent nothing, for a call that *send* must carry instead
    """

    __slots__ = (
        "_busy",
        "_direct",
        "_flusher",
        "_idle",
        "_max_bytes",
        "_max_tasks",
        "_public",
        "_queue",
        "_send",
        "_sending",
    )

    def __init__(
        self,
        send: Sender,
        public: Callable[[Refusal, Sequence[NewTask]], BaseException],
        *,
        max_tasks: int,
        max_bytes: int,
        direct: Callable[[], Sender | None] = lambda: None,
    ) -> None:
        self._send = send
        self._direct = direct
        self._public = public
        self._max_tasks = max_tasks
        self._max_bytes = max_bytes
        self._busy = False
        self._queue: deque[_Call] = deque()
        #: the queued calls on the wire now
        self._sending: list[_Call] = []
        self._flusher: asyncio.Task[None] | None = None
        #: set while nothing is on the wire or queued (aclose waits for it)
        self._idle = asyncio.Event()
        self._idle.set()

    async def submit(self, news: list[NewTask]) -> list[str]:
        """Enqueue *news* (one caller's tasks, atomically); return their ids.

        :raises Exception: the public error of a refusal of these tasks, or
            the failure of the script call that carried them
        """
        loop = asyncio.get_running_loop()
        if self._busy:
            call = _Call(news, loop.create_future())
            self._queue.append(call)
            return await call.future
        # Nothing in flight: sent now.
        self._busy = True
        self._idle.clear()
        if (direct := self._direct()) is not None:
            try:
                ids = await direct(news)
            except SendElsewhere:
                pass  # nothing sent: the lane's own way below
            except BaseException as exc:
                self._after_lone(exc)
                if isinstance(exc, _REFUSALS):
                    raise self._public(exc, news) from None
                raise
            else:
                self._after_lone(None)
                return ids
        # In a task of its own, and the lane busy until it is answered, even
        # when its caller is cancelled.
        sent = loop.create_task(self._send(news))
        sent.add_done_callback(self._after_task)
        try:
            return await asyncio.shield(sent)
        except _REFUSALS as refusal:
            raise self._public(refusal, news) from None

    def _after_task(self, sent: asyncio.Task[list[str]]) -> None:
        self._after_lone(None if sent.cancelled() else sent.exception())

    def _after_lone(self, error: BaseException | None) -> None:
        """A lone call is answered (*error*: how it failed): the calls
        queued meanwhile go next."""
        if isinstance(error, RedisUnavailableError):
            self._fail_queued(error)
        if self._queue:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        else:
            self._go_idle()

    async def aclose(self) -> None:
        """Wait until the calls sent or queued so far are answered."""
        while self._busy:
            await self._idle.wait()

    def _go_idle(self) -> None:
        self._busy = False
        self._idle.set()

    def _fail_queued(self, error: BaseException | None) -> None:
        """Redis did not answer the call on the wire within its budget: the
        calls queued behind it, not sent, fail now (nothing of them was
        written) instead of each waiting out a budget of its own."""
        assert isinstance(error, RedisUnavailableError)
        while self._queue:
            self._queue.popleft().fail(RedisUnavailableError(error.detail))

    async def _flush(self) -> None:
        try:
            while True:
                if not self._queue:
                    # The callers just answered run first: what they enqueue
                    # next joins this round instead of starting a lone call.
                    await asyncio.sleep(0)
                    if not self._queue:
                        return
                self._sending = self._take()
                await self._send_calls(self._sending)
        except BaseException as exc:
            # Cancelled (the loop is closing), or a failure of our own: every
            # call left hears of it (one already sent may have been written).
            left = (*self._sending, *self._queue)
            self._queue.clear()
            for call in left:
                if isinstance(exc, Exception):
                    call.fail(exc)
                else:
                    call.future.cancel()
            raise
        finally:
            self._sending = []
            self._flusher = None
            self._go_idle()

    def _take(self) -> list[_Call]:
        """The queued calls that fit in one script call, oldest first (a
        caller cancelled while it waited is dropped: nothing was sent)."""
        taken: list[_Call] = []
        tasks = size = 0
        queue = self._queue
        while queue:
            call = queue[0]
            if call.future.done():
                queue.popleft()
                continue
            if taken and (
                tasks + len(call.news) > self._max_tasks
                or size + call.size > self._max_bytes
            ):
                break
            queue.popleft()
            taken.append(call)
            tasks += len(call.news)
            size += call.size
        return taken

    async def _send_calls(self, calls: list[_Call]) -> None:
        """Send *calls* in one script call and answer each; a call refused
        on its own is answered and the rest sent again."""
        while calls:
            news = [new for call in calls for new in call.news]
            try:
                ids = await self._send(news)
            except (GroupFullRefusal, GroupCorruptRefusal) as refusal:
                call, first = _owner(calls, refusal.index)
                call.fail(self._public(_shifted(refusal, first), call.news))
                calls.remove(call)
                continue
            except NotReplicatedRefusal as refusal:
                # Written on the primary, every call of it: each learns its ids.
                for call, part in _parts(calls, refusal.ids):
                    call.fail(
                        self._public(NotReplicatedRefusal(part, refusal.acked), [])
                    )
                return
            except OutcomeUnknownError as exc:
                for call, part in _parts(calls, [new.id for new in news]):
                    own = OutcomeUnknownError(part, exc.detail)
                    own.__cause__ = exc.__cause__
                    call.fail(own)
                self._fail_queued(exc)
                return
            except Exception as exc:  # noqa: BLE001 - each caller raises it
                for call in calls:
                    call.fail(exc)
                if isinstance(exc, RedisUnavailableError):
                    self._fail_queued(exc)
                return
            for call, part in _parts(calls, ids):
                call.answer(part)
            return


def _owner(calls: list[_Call], index: int) -> tuple[_Call, int]:
    """The call holding task *index* of their script call, and the index of
    its first task there."""
    first = 0
    for call in calls:
        if index < first + len(call.news):
            return call, first
        first += len(call.news)
    raise IndexError(index)


def _parts(calls: list[_Call], ids: list[str]) -> list[tuple[_Call, list[str]]]:
    """Each call with its slice of *ids* (one per task, in order)."""
    out = []
    first = 0
    for call in calls:
        stop = first + len(call.news)
        out.append((call, ids[first:stop]))
        first = stop
    return out


def _shifted(
    refusal: GroupFullRefusal | GroupCorruptRefusal, first: int
) -> GroupFullRefusal | GroupCorruptRefusal:
    if isinstance(refusal, GroupFullRefusal):
        return GroupFullRefusal(refusal.index - first, refusal.live, refusal.cap)
    return GroupCorruptRefusal(refusal.index - first)
