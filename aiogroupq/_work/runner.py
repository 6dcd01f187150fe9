"""One claimed task's life on a consumer: decode, run the handler under its
lease and timeout, and turn what happened into an outcome for ``finish.lua``."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from .._store.codec import EncodeFailure, describe_decode_error, encode_payload, unpack
from .._store.defaults import START_WINDOW
from .._store.scripts import Claimed, Outcome
from .._telemetry.events import EventKind, Observers
from .._telemetry.log import describe, short, task_extra
from ..errors import BatchFailed, Retry
from ..task import DeadLetter, Envelope, TaskInfo, _batch, _current

if TYPE_CHECKING:
    from .handlers import Route

logger = logging.getLogger("aiogroupq.consumer")

#: longest traceback kept with a dead letter, in characters
MAX_TRACEBACK: Final = 16_000
#: what an envelope adds to its payload at most: a 28-character id, a task
#: type and a group of at most 256 bytes each, a few integers, headers
ENVELOPE_OVERHEAD: Final = 1024


class Running:
    """A task this consumer holds, from claim until its outcome is recorded.

    The heartbeat tells it what the server answered through :meth:`extend`,
    :meth:`mark_lost` and :meth:`request_cancel`; the runner reads the flags
    once the handler ended.

    :param claimed: what the claim returned
    :param deadline: the local lease deadline (the event loop's clock): a
        handler still running then is stopped, so a consumer that cannot
        renew its leases stops by itself
    :param start_by: a task of a group starts before this (the event loop's
        clock) or not at all: its claim's start window (START_WINDOW)
    """

    # One timer per running handler, plain asyncio: an anyio cancel scope
    # for the lease and another for the timeout cost several times more per
    # task, and a consumer runs thousands of tasks a second.
    __slots__ = (
        "__weakref__",
        "_handle",
        "_task",
        "_until",
        "_when",
        "cancel_requested",
        "claimed",
        "deadline",
        "duration",
        "frame",
        "head",
        "info",
        "lost",
        "members",
        "settled",
        "start_by",
        "stopped_by",
    )

    def __init__(
        self,
        claimed: Claimed,
        *,
        deadline: float = math.inf,
        start_by: float = math.inf,
    ) -> None:
        self.claimed = claimed
        self.deadline = deadline
        self.start_by = start_by
        self.lost = False
        self.cancel_requested = False
        # What the handler sees, once the envelope decoded (for logs and events).
        self.info: TaskInfo | None = None
        # The frame that awaits the handler, while it runs: the watchdog looks
        # for it on a stalled loop's stack.
        self.frame: FrameType | None = None
        # Seconds the handler ran, once it ended.
        self.duration: float | None = None
        #: what stopped the handler: "lease" (lost, cancelled on request or
        #: past the local lease deadline) or "timeout"; None while it runs
        #: or when it ended by itself
        self.stopped_by: str | None = None
        # While the handler runs: its task, the end of its timeout, and the
        # timer that stops it at the earlier of that and the lease deadline.
        self._task: asyncio.Task[Any] | None = None
        self._until = math.inf
        self._handle: asyncio.Handle | None = None
        self._when = math.inf
        #: a batch's head: its members, in order (they run in its handler);
        #: a tuple, so that a task of no batch allocates nothing for it
        self.members: Sequence[Running] = ()
        #: a batch's member: its head, whose handler runs it
        self.head: Running | None = None
        #: a member's outcome was submitted (or will never be: lease lost)
        self.settled = False

    def extend(self, deadline: float) -> None:
        """Move the local lease deadline: a renewal holds the lease until then."""
        self.deadline = deadline
        # A later deadline is seen when the timer fires (no re-arming per
        # heartbeat); an earlier one needs the timer earlier.
        if self._task is not None and deadline < self._when:
            self._arm()

    def mark_lost(self) -> None:
        """The lease is gone (the task was recovered): stop the handler, and
        drop whatever it returns."""
        self.lost = True
        self._stop("lease")
        # A batch runs as one: a member's lease lost means the whole batch
        # was recovered (lib/batch.lua), so its handler stops.
        if self.head is not None and not self.head.lost:
            self.head.mark_lost()

    def line_members(self, send: Callable[[Outcome], object]) -> None:
        """Send the members of this head's batch that have no outcome back
        to the front of their group's line, last first (each goes to the
        front), so that the line keeps their order; nothing when the lease
        was lost (the batch comes back whole)."""
        for member in reversed(self.members):
            if not member.settled:
                member.settled = True
                if not self.lost:
                    claimed = member.claimed
                    send(Outcome(claimed.id, claimed.token, "line"))

    def abandon(self) -> None:
        """Give up a batch before its handler started, with no outcome (a
        top-up's reply was lost: the batch may hold members we do not know):
        dropped as a lost lease's are, the batch comes back whole when its
        leases expire."""
        self.lost = True

    def request_cancel(self) -> None:
        """Someone asked to cancel the task: stop the handler (once)."""
        if not self.cancel_requested:
            self.cancel_requested = True
            self._stop("lease")

    def expire(self) -> None:
        """The local lease deadline passed: stop the handler now, before its
        deadline's timer would (the watchdog's way on a stalled loop)."""
        self._stop("lease")

    def begin(self, task: asyncio.Task[Any], timeout: float | None) -> None:
        """The handler starts in *task*, for at most *timeout* seconds: stop
        it at the earlier of that and the lease deadline, or at once when
        the lease was lost or a cancellation requested before it started."""
        self._task = task
        if timeout is not None:
            self._until = task.get_loop().time() + timeout
        if self.lost or self.cancel_requested:
            # From the loop, not here: a task that cancels itself keeps the
            # request even when the handler returns without awaiting
            # (Python 3.11/3.12), and its worker's next await would raise.
            self._handle = task.get_loop().call_soon(self._stop, "lease")
        else:
            self._arm()

    def end(self, *, cancelled: bool) -> str | None:
        """The handler ended (*cancelled*: with a cancellation): what stopped
        it, or None if nothing of ours did, or if something else cancelled it
        too (the consumer's shutdown: that cancellation goes on)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        task, self._task = self._task, None
        if self.stopped_by is None or task is None:
            return None
        # Our task.cancel() is ours to take back, caught or not (a handler
        # may swallow it), so that no later await sees it.
        if task.uncancel() > 0 or not cancelled:
            self.stopped_by = None
        return self.stopped_by

    def _arm(self) -> None:
        assert self._task is not None
        when = min(self.deadline, self._until)
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._when = when
        if when != math.inf:
            self._handle = self._task.get_loop().call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        if self._task is None:
            return
        now = self._task.get_loop().time()
        if now >= self.deadline:
            self._stop("lease")
        elif now >= self._until:
            self._stop("timeout")
        else:  # the lease was extended meanwhile
            self._arm()

    def _stop(self, reason: str) -> None:
        # Only while the handler runs, and once: the first reason stands.
        if self._task is not None and self.stopped_by is None:
            self.stopped_by = reason
            self._task.cancel()

    def describe(self) -> str:
        """``task <id> (type …, group …, attempt n of m)``, as known."""
        info = self.info
        if info is None:
            return describe(self.claimed.id, None, None, self.claimed.attempt)
        return describe(info.id, info.type, info.group, info.attempt, info.max_attempts)

    def extra(self, queue: str) -> dict[str, object]:
        """The extra fields of a log record about this task."""
        info = self.info
        return task_extra(
            queue,
            self.claimed.id,
            info.type if info else None,
            info.group if info else None,
            self.claimed.attempt,
        )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter: ``base * 2**(attempt-1)``, capped, times
    a random factor in [0.5, 1]."""

    base: float
    cap: float

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number *attempt*."""
        growth: float = 2.0 ** min(attempt - 1, 60)
        return min(self.cap, self.base * growth) * (0.5 + random.random() / 2)


Submit = Callable[[Outcome, DeadLetter | None], None]
#: top up a batch: ``topup(head, task_type, most)`` claims up to *most*
#: more tasks of the head's group (``batch_extend.lua``), adds them to
#: ``head.members`` and returns how many it added, or -1 when the batch must
#: not grow any more (the call failed and the head was abandoned, or what it
#: took was handed back unreplicated); *most* 0 only asks whether the head
#: may grow at all (-1: a recovered batch's head, which runs alone)
TopUp = Callable[["Running", str, int], Awaitable[int]]


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__qualname__}: {exc}"


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]


class _Attempt:
    """Builds the outcome of one attempt."""

    __slots__ = (
        "_submit",
        "claimed",
        "envelope",
        "observers",
        "payload",
        "route",
        "running",
        "sent",
    )

    # Set by _decode, once the task decoded.
    route: Route
    payload: Any

    def __init__(self, running: Running, submit: Submit, observers: Observers) -> None:
        self.running = running
        self.claimed = running.claimed
        self._submit = submit
        self.observers = observers
        self.envelope: Envelope | None = None
        self.sent = False  # an outcome was submitted for this attempt

    def submit(self, outcome: Outcome, notice: DeadLetter | None) -> None:
        self.sent = True
        self._submit(outcome, notice)

    def about(self) -> str:
        """The task as log messages name it."""
        envelope, claimed = self.envelope, self.claimed
        if envelope is None:
            return describe(claimed.id, None, None, claimed.attempt)
        return describe(
            claimed.id,
            envelope.type,
            envelope.group,
            claimed.attempt,
            claimed.max_attempts or envelope.max_attempts,
        )

    def extra(self) -> dict[str, object]:
        envelope = self.envelope
        return task_extra(
            self.observers.queue,
            self.claimed.id,
            envelope.type if envelope else None,
            envelope.group if envelope else None,
            self.claimed.attempt,
        )

    def outcome(self, kind: str, arg1: str | int | bytes = "", arg2: str = "") -> None:
        self.submit(
            Outcome(self.claimed.id, self.claimed.token, kind, arg1, arg2), None
        )

    def dead(self, reason: str, trace: str = "", *, halt: bool = False) -> None:
        """Dead-letter the task (the group halts behind it with *halt*)."""
        claimed, envelope = self.claimed, self.envelope
        notice = DeadLetter(
            id=claimed.id,
            type=envelope.type if envelope else "?",
            group=envelope.group if envelope else None,
            payload=None,
            reason=reason,
            traceback=trace,
            attempts=claimed.attempt,
            dead_at=0.0,
        )
        kind = "halt" if halt and envelope and envelope.group else "dead"
        self.submit(Outcome(claimed.id, claimed.token, kind, reason, trace), notice)

    def reject(
        self,
        message: str,
        *args: object,
        reason: str,
        trace: str = "",
        halt: bool = False,
        exc_info: BaseException | None = None,
    ) -> None:
        """Log *message* at ERROR (its first ``%s`` names the task, *args*
        fill the others) and dead-letter the task with *reason*."""
        logger.error(
            message, self.about(), *args, exc_info=exc_info, extra=self.extra()
        )
        self.dead(reason, trace, halt=halt)

    def too_large(self, size: int, what: str, limit: int) -> None:
        """Dead-letter a task too large to decode (never halts: the size
        limit is the consumer's, not the task type's)."""
        allowed = f"{limit}" if what == "payload" else f"{limit} + {ENVELOPE_OVERHEAD}"
        self.reject(
            "%s is too large: %s of %d bytes, over the consumer's limit; dead-lettered",
            what,
            size,
            reason=f"PayloadTooLarge: the stored {what} is {size} bytes, over the "
            f"{allowed} bytes this consumer's max_payload_bytes allows (raise "
            "Consumer(max_payload_bytes=...) to match the producer's)",
        )

    def failed(
        self, default: RetryPolicy, exc: BaseException, *, delay: float | None
    ) -> None:
        """Retry per the policy, or dead-letter on the last attempt."""
        envelope, claimed, options = self.envelope, self.claimed, self.route.options
        assert envelope is not None
        halt = options.on_dead == "halt"
        retry = isinstance(exc, Retry)
        if not retry:
            self.observers.emit(
                EventKind.FAILED,
                task_id=claimed.id,
                task_type=envelope.type,
                group=envelope.group,
                attempt=claimed.attempt,
                duration=self.running.duration,
                error=exc,
            )
        if isinstance(exc, options.no_retry):
            self.reject(
                "%s failed with %s, which is not retried; dead-lettered",
                _reason(exc),
                reason=_reason(exc),
                trace=_trace(exc),
                halt=halt,
                exc_info=exc,
            )
            return
        if claimed.attempt >= (claimed.max_attempts or envelope.max_attempts):
            self.reject(
                "%s failed on its last attempt with %s; dead-lettered",
                "a Retry request" if retry else _reason(exc),
                reason="Retry requested on the last attempt" if retry else _reason(exc),
                trace="" if retry else _trace(exc),
                halt=halt,
                exc_info=None if retry else exc,
            )
            return
        if delay is None:
            policy = RetryPolicy(
                default.base
                if options.retry_backoff is None
                else options.retry_backoff,
                default.cap
                if options.retry_backoff_max is None
                else options.retry_backoff_max,
            )
            delay = policy.delay(claimed.attempt)
        if retry:
            logger.warning(
                "%s asked to retry in %.3fs",
                self.about(),
                delay,
                extra=self.extra(),
            )
        else:
            logger.warning(
                "%s failed with %s; retrying in %.3fs",
                self.about(),
                _reason(exc),
                delay,
                exc_info=exc,
                extra=self.extra(),
            )
        self.outcome("retry", max(0, round(delay * 1000)), _reason(exc))


async def run_task(
    running: Running,
    routes: dict[str, Route],
    policy: RetryPolicy,
    submit: Submit,
    *,
    max_payload_bytes: int,
    observers: Observers | None = None,
    topup: TopUp | None = None,
) -> None:
    """Run one claimed task (or a batch: *running* with its members) and
    submit its outcome.

    Never raises for anything the task does or holds, except the cancellation
    of the consumer itself (shutdown), after handing the task back: whatever
    its stored bytes are, the task gets an outcome and the consumer goes on.
    """
    attempt = _Attempt(
        running, submit, Observers("") if observers is None else observers
    )
    try:
        await _run(attempt, running, routes, policy, max_payload_bytes, topup)
    except Exception as exc:
        # A bug of ours, met by this task only: fail the task, not the
        # consumer (a crash would come back on every claim of it).
        logger.exception(
            "internal error while running %s",
            attempt.about(),
            extra=attempt.extra(),
        )
        if running.members:
            _line_rest(running, submit)
        if not attempt.sent:
            attempt.dead(f"InternalError: {_reason(exc)}", _trace(exc))
    finally:
        if running.members:
            # The head was rejected, or handed back before its batch ran.
            _line_rest(running, submit)


def _out_of_range(envelope: Envelope) -> str:
    """What a producer never writes but well-formed bytes can hold ("" if
    nothing): the attempt logic relies on these bounds."""
    if envelope.max_attempts < 1:
        return f"max_attempts is {envelope.max_attempts}, not >= 1"
    if envelope.timeout_ms is not None and envelope.timeout_ms < 1:
        return f"timeout_ms is {envelope.timeout_ms}, not >= 1"
    return ""


async def _run(
    attempt: _Attempt,
    running: Running,
    routes: dict[str, Route],
    policy: RetryPolicy,
    max_payload_bytes: int,
    topup: TopUp | None = None,
) -> None:
    """The attempt's steps: decode, invoke the handler under its lease and
    timeout, conclude; a task that cannot run is rejected on the way."""
    envelope = _decode(attempt, routes, max_payload_bytes)
    if envelope is None:
        return  # rejected
    if attempt.route.options.batch_size is not None:
        batch = _Batch(attempt, running, envelope, policy)
        await batch.run(routes, max_payload_bytes, topup)
        return
    task = asyncio.current_task()
    assert task is not None
    now = task.get_loop().time()
    if now >= running.deadline:
        # The claim's reply came too late (a Redis stall): the lease may be
        # gone already. The handler never ran, so no attempt is counted; if
        # the task was recovered meanwhile, this hand-back is refused.
        attempt.outcome("back")
        return
    if envelope.group is not None and now >= running.start_by:
        # Its group may have been paused since the claim, and a pause waits
        # only this long for what was claimed before it: not started now,
        # the task goes back to the front of its group, its attempt uncounted.
        logger.warning(
            "%s did not start within %.0fs of its claim (a blocked event "
            "loop?); handed back unstarted",
            attempt.about(),
            START_WINDOW,
            extra=attempt.extra(),
        )
        attempt.outcome("back")
        return
    route = attempt.route
    timeout = (
        route.options.timeout
        if envelope.timeout_ms is None
        else envelope.timeout_ms / 1000
    )
    info = _begin(attempt, envelope)
    context_token = _current.set(info)
    stopped, result = None, None  # a stopped handler returns nothing
    running.frame = sys._getframe()
    started = time.perf_counter()
    running.begin(task, timeout)
    try:
        with attempt.observers.handler(info):
            if route.takes_payload:
                result = await route.func(attempt.payload)
            else:
                result = await route.func()
    except asyncio.CancelledError:
        stopped = running.end(cancelled=True)
        if stopped is None:
            # The consumer is shutting down past its grace period: the task
            # did not finish, so it goes back to the front of its group,
            # uncounted.
            attempt.outcome("back")
            raise
    except Retry as exc:
        running.end(cancelled=False)
        running.duration = time.perf_counter() - started
        attempt.failed(policy, exc, delay=exc.delay)
        return
    except Exception as exc:  # noqa: BLE001 - any handler error is an outcome
        running.end(cancelled=False)
        running.duration = time.perf_counter() - started
        attempt.failed(policy, exc, delay=None)
        return
    else:
        running.end(cancelled=False)
    finally:
        # Ended already on every path above; a BaseException none of them
        # takes must not leave the stop timer armed for the next task.
        running.end(cancelled=True)
        running.frame = None
        _current.reset(context_token)
    running.duration = time.perf_counter() - started
    _conclude(attempt, policy, result, stopped, timeout)


def _decode(
    attempt: _Attempt, routes: dict[str, Route], max_payload_bytes: int
) -> Envelope | None:
    """Decode the task's envelope and payload, and find its handler (in
    ``attempt.route`` and ``attempt.payload``); None if the task was rejected."""
    stored = attempt.claimed.envelope
    # Checked before decoding: decoding cost grows with size.
    if len(stored) > max_payload_bytes + ENVELOPE_OVERHEAD:
        attempt.too_large(len(stored), "envelope", max_payload_bytes)
        return None
    try:
        envelope = attempt.envelope = unpack(stored)
    except Exception as exc:  # noqa: BLE001 - any bytes at all may be stored
        detail = describe_decode_error(exc)
        attempt.reject(
            "%s has a corrupt envelope: %s; dead-lettered",
            detail,
            reason=f"CorruptEnvelope: {detail}",
        )
        return None
    if len(envelope.payload) > max_payload_bytes:
        attempt.too_large(len(envelope.payload), "payload", max_payload_bytes)
        return None
    if problem := _out_of_range(envelope):
        attempt.reject(
            "%s has a corrupt envelope: %s; dead-lettered",
            problem,
            reason=f"CorruptEnvelope: {problem}",
        )
        return None
    route = routes.get(envelope.type)
    if route is None:
        attempt.reject(
            "%s has no handler here; dead-lettered",
            reason="UnknownTaskType: no handler for task type "
            f"{short(envelope.type)}; this consumer handles {sorted(routes)!r}",
        )
        return None
    try:
        attempt.payload = route.decoder.decode(envelope.payload)
    except Exception as exc:  # noqa: BLE001 - also a dataclass's __post_init__
        detail = describe_decode_error(exc)
        attempt.reject(
            "payload of %s does not decode into %s: %s; dead-lettered",
            route.describe_type(),
            detail,
            reason="InvalidPayload: payload does not decode into "
            f"{route.describe_type()}: {detail}",
            halt=route.options.on_dead == "halt",
        )
        return None
    attempt.route = route
    return envelope


def _begin(attempt: _Attempt, envelope: Envelope) -> TaskInfo:
    """What the handler sees of its task; logged and told to the observers."""
    running, claimed = attempt.running, attempt.claimed
    info = running.info = TaskInfo(
        id=claimed.id,
        type=envelope.type,
        group=envelope.group,
        attempt=claimed.attempt,
        # The hash's count, which recovery goes by too (the envelope's
        # is what the producer wrote; they differ only if one was changed).
        max_attempts=claimed.max_attempts or envelope.max_attempts,
        fencing_token=claimed.token,
        enqueued_at=envelope.enqueued_ms / 1000,
        started_at=claimed.claimed_ms / 1000,
        due_at=claimed.due_ms / 1000,
        headers=envelope.headers or {},
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug("%s started", attempt.about(), extra=attempt.extra())
    observers = attempt.observers
    if observers:
        observers.emit(
            EventKind.STARTED,
            task_id=claimed.id,
            task_type=envelope.type,
            group=envelope.group,
            attempt=claimed.attempt,
            # Both on the server's clock; 0 when an older server left it out.
            latency=max(0.0, (claimed.claimed_ms - claimed.due_ms) / 1000)
            if claimed.due_ms and claimed.claimed_ms
            else None,
        )
    return info


def _conclude(
    attempt: _Attempt,
    policy: RetryPolicy,
    result: object,
    stopped: str | None,
    timeout: float | None,
) -> None:
    """Turn a handler that returned, timed out or was stopped (*stopped*:
    by what, see :attr:`Running.stopped_by`) into its outcome."""
    running, route = attempt.running, attempt.route
    if stopped == "lease":
        if running.lost:
            logger.warning(
                "lease of %s was lost; its handler was cancelled and its "
                "result is dropped",
                attempt.about(),
                extra=attempt.extra(),
            )
        elif running.cancel_requested:
            logger.info(
                "%s cancelled on request", attempt.about(), extra=attempt.extra()
            )
            attempt.outcome("cancel")
        else:
            # Our own lease deadline passed without a renewal: we may still
            # hold the task, so count a failed attempt (refused if recovered).
            stalled = TimeoutError("the lease could not be renewed in time")
            attempt.failed(policy, stalled, delay=0.0)
    elif stopped == "timeout":
        late = TimeoutError(f"the attempt exceeded its timeout of {timeout}s")
        attempt.failed(policy, late, delay=None)
    elif route.options.store_result:
        try:
            encoded = encode_payload(result)
        except EncodeFailure as exc:
            attempt.reject(
                "result of %s cannot be stored: %s; dead-lettered",
                exc,
                reason=f"UnencodableResult: {exc}",
                halt=route.options.on_dead == "halt",
            )
        else:
            _succeeded(attempt, running.duration)
            attempt.outcome("ok", bytes(encoded))
    else:
        _succeeded(attempt, running.duration)
        attempt.outcome("ok")


def _succeeded(attempt: _Attempt, duration: float | None) -> None:
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "%s succeeded in %.3fs", attempt.about(), duration, extra=attempt.extra()
        )


def _line_rest(head: Running, submit: Submit) -> None:
    head.line_members(lambda outcome: submit(outcome, None))


class _Batch:
    """One run of a batch handler (``Handler(batch_size=N)``): the head's
    attempt and its members', whose outcomes are sent together at the end:
    the members given back first (``line``), then the judged ones, the
    head's last (``finish.lua`` keeps the head's member list until then,
    for a recovery that meets the batch half finished)."""

    def __init__(
        self,
        head: _Attempt,
        running: Running,
        envelope: Envelope,
        policy: RetryPolicy,
    ) -> None:
        self.head = head
        self.running = running
        self.envelope = envelope
        self.policy = policy
        self.route = head.route
        #: the outcomes submitted so far, by the task's place in the batch
        self.judged: list[tuple[int, Outcome, DeadLetter | None]] = []
        #: the attempts that run in the handler, in order
        self.runs: list[_Attempt] = [head]
        self._submit = head._submit
        head._submit = self._collector(0)

    def _collector(self, place: int) -> Submit:
        def collect(outcome: Outcome, notice: DeadLetter | None) -> None:
            self.judged.append((place, outcome, notice))

        return collect

    async def run(
        self,
        routes: dict[str, Route],
        max_payload_bytes: int,
        topup: TopUp | None,
    ) -> None:
        try:
            await self._run(routes, max_payload_bytes, topup)
        finally:
            self._flush()

    def _flush(self) -> None:
        running, submit = self.running, self._submit
        self.head._submit = submit  # an internal error's outcome goes out
        for place, _, _ in self.judged:
            if place:
                running.members[place - 1].settled = True
        _line_rest(running, submit)
        if running.lost:
            return  # the batch was recovered: nothing of it is ours to judge
        for _, outcome, notice in sorted(self.judged, key=_place, reverse=True):
            submit(outcome, notice)

    async def _fill(self, topup: TopUp) -> None:
        """Wait up to batch_wait for more tasks of the group (a little less
        than the start window of the claim: the batch must start in it)."""
        running, options = self.running, self.route.options
        size = options.batch_size
        assert size is not None
        loop = asyncio.get_running_loop()
        until = min(
            loop.time() + options.batch_wait,
            running.start_by - 0.5,
            running.deadline - 0.5,
        )
        step = max(0.01, options.batch_wait / 10)
        if running.claimed.alone:
            return  # a recovered batch's head: it runs alone (lib/batch.lua)
        while len(running.members) + 1 < size:
            left = until - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(left, step))
            if running.lost:
                return
            most = size - 1 - len(running.members)
            if await topup(running, self.envelope.type, most) < 0:
                return

    async def _run(
        self,
        routes: dict[str, Route],
        max_payload_bytes: int,
        topup: TopUp | None,
    ) -> None:
        running, head, envelope = self.running, self.head, self.envelope
        options = self.route.options
        try:
            if options.batch_wait and envelope.group is not None and topup is not None:
                await self._fill(topup)
            if running.lost:
                return
            task = asyncio.current_task()
            assert task is not None
            now = task.get_loop().time()
            if now >= running.deadline or (
                envelope.group is not None and now >= running.start_by
            ):
                # As for a single task (see _run): not started, handed back
                # uncounted, its members to the front of the line behind it.
                head.outcome("back")
                return
            envelopes = [envelope]
            for place, member in enumerate(running.members, 1):
                attempt = _Attempt(member, self._collector(place), head.observers)
                found = _decode(attempt, routes, max_payload_bytes)
                if found is None:
                    break  # rejected: the members after it go back to the line
                if attempt.route is not self.route:
                    # Another type (a damaged hash): it and those after it go
                    # back to the line, to run as heads of their own.
                    break
                self.runs.append(attempt)
                envelopes.append(found)
        except asyncio.CancelledError:
            # The shutdown, before the handler started: the head goes back
            # uncounted, its members behind it (_flush), as an unstarted
            # claim's; an abandoned batch sends nothing.
            if not running.lost and not head.sent:
                head.outcome("back")
            raise
        await self._call(task, envelopes)

    async def _call(self, task: asyncio.Task[Any], envelopes: list[Envelope]) -> None:
        running, head, route, policy = self.running, self.head, self.route, self.policy
        timeout = (
            route.options.timeout
            if self.envelope.timeout_ms is None
            else self.envelope.timeout_ms / 1000
        )
        infos = [
            _begin(attempt, envelope)
            for attempt, envelope in zip(self.runs, envelopes, strict=True)
        ]
        context_token = _current.set(infos[0])
        batch_token = _batch.set(infos)
        stopped, result = None, None
        running.frame = sys._getframe()
        started = time.perf_counter()
        running.begin(task, timeout)
        try:
            with head.observers.handler(infos[0]):
                result = await route.func([attempt.payload for attempt in self.runs])
        except asyncio.CancelledError:
            stopped = running.end(cancelled=True)
            if stopped is None:
                head.outcome("back")  # shutdown: the whole batch goes back
                raise
        except BatchFailed as exc:
            running.end(cancelled=False)
            self._took(started)
            self._failed_at(exc)
            return
        except Exception as exc:  # noqa: BLE001 - any handler error is an outcome
            running.end(cancelled=False)
            self._took(started)
            head.failed(
                policy, exc, delay=exc.delay if isinstance(exc, Retry) else None
            )
            return
        else:
            running.end(cancelled=False)
        finally:
            running.end(cancelled=True)
            running.frame = None
            _batch.reset(batch_token)
            _current.reset(context_token)
        self._took(started)
        if stopped is not None:
            # Stopped as a single task is, and judged as one: the head's
            # outcome; the members go back to the line behind it.
            _conclude(head, policy, None, stopped, timeout)
            return
        self._succeeded(result)

    def _took(self, started: float) -> None:
        duration = time.perf_counter() - started
        for attempt in self.runs:
            attempt.running.duration = duration

    def _failed_at(self, exc: BatchFailed) -> None:
        """BatchFailed(done=k): the first k succeeded, the next one failed."""
        done = min(exc.done, len(self.runs))
        self._ok(self.runs[:done], [None] * done)
        if done < len(self.runs):
            error = exc.error
            delay = error.delay if isinstance(error, Retry) else None
            self.runs[done].failed(self.policy, error, delay=delay)

    def _succeeded(self, result: object) -> None:
        runs = self.runs
        results: list[object] = [None] * len(runs)
        if self.route.options.store_result and result is not None:
            if not isinstance(result, list) or len(result) != len(runs):
                got = (
                    f"a list of {len(result)}"
                    if isinstance(result, list)
                    else type(result).__name__
                )
                wrong = TypeError(
                    "a batch handler with store_result must return None or a "
                    f"list of one result per task ({len(runs)}), got {got}"
                )
                self.head.failed(self.policy, wrong, delay=None)
                return
            results = result
        self._ok(runs, results)

    def _ok(self, runs: list[_Attempt], results: list[object]) -> None:
        """Each of *runs* succeeded with its result; one whose result cannot
        be stored is dead-lettered, and those after it go back to the line."""
        store = self.route.options.store_result
        for attempt, value in zip(runs, results, strict=True):
            if not store:
                _succeeded(attempt, attempt.running.duration)
                attempt.outcome("ok")
                continue
            try:
                encoded = encode_payload(value)
            except EncodeFailure as exc:
                attempt.reject(
                    "result of %s cannot be stored: %s; dead-lettered",
                    exc,
                    reason=f"UnencodableResult: {exc}",
                    halt=self.route.options.on_dead == "halt",
                )
                return
            _succeeded(attempt, attempt.running.duration)
            attempt.outcome("ok", bytes(encoded))


def _place(item: tuple[int, Outcome, DeadLetter | None]) -> int:
    return item[0]
