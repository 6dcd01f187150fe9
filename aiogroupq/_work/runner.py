"""One claimed task's life on a consumer: decode, run the handler under its
lease and timeout, and turn what happened into an outcome for ``finish.lua``."""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._limits import ENVELOPE_OVERHEAD, START_WINDOW
from .._store.codec import (
    EncodeFailure,
    describe_decode_error,
    encode_payload,
    out_of_range,
    unpack,
)
from .._store.scripts import Outcome, OutcomeKind
from .._telemetry.events import EventKind, Observers
from .._telemetry.log import describe, short, task_extra
from ..errors import Retry
from ..task import CURRENT_TASK, DeadLetter, Envelope, TaskInfo

if TYPE_CHECKING:
    from .handlers import Route
    from .running import Running, StoppedBy

logger = logging.getLogger("aiogroupq.consumer")

#: longest traceback kept with a dead letter, in characters
MAX_TRACEBACK: Final = 16_000


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
#: runs a batch handler's task (``batch.run_batch`` with the consumer's
#: top-up): ``batch(head, envelope, policy, routes, max_payload_bytes)``
RunBatch = Callable[
    ["_Attempt", Envelope, "RetryPolicy", "dict[str, Route]", int], Awaitable[None]
]


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

    def outcome(
        self, kind: OutcomeKind, arg1: str | int | bytes = "", arg2: str = ""
    ) -> None:
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
        kind: OutcomeKind = "halt" if halt and envelope and envelope.group else "dead"
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

    def succeeded(self, result: object) -> bool:
        """The handler returned *result*: the task succeeded, its result
        stored if its handler says so; False if that result cannot be stored
        (the task is dead-lettered instead)."""
        options = self.route.options
        stored: bytes | str = ""
        if options.store_result:
            try:
                stored = bytes(encode_payload(result))
            except EncodeFailure as exc:
                self.reject(
                    "result of %s cannot be stored: %s; dead-lettered",
                    exc,
                    reason=f"UnencodableResult: {exc}",
                    halt=options.on_dead == "halt",
                )
                return False
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "%s succeeded in %.3fs",
                self.about(),
                self.running.duration,
                extra=self.extra(),
            )
        self.outcome("ok", stored)
        return True

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
    batch: RunBatch | None = None,
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
        await _run(attempt, running, routes, policy, max_payload_bytes, batch)
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


async def _run(
    attempt: _Attempt,
    running: Running,
    routes: dict[str, Route],
    policy: RetryPolicy,
    max_payload_bytes: int,
    batch: RunBatch | None = None,
) -> None:
    """The attempt's steps: decode, invoke the handler under its lease and
    timeout, conclude; a task that cannot run is rejected on the way."""
    envelope = _decode(attempt, routes, max_payload_bytes)
    if envelope is None:
        return  # rejected
    if attempt.route.options.batch_size is not None:
        if batch is None:
            raise RuntimeError(
                "a batch handler's task reached a runner of single tasks"
            )
        await batch(attempt, envelope, policy, routes, max_payload_bytes)
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
    args = (attempt.payload,) if route.takes_payload else ()
    stopped, result, error = await _invoke(attempt, task, info, timeout, *args)
    if error is not None:
        attempt.failed(
            policy, error, delay=error.delay if isinstance(error, Retry) else None
        )
        return
    _conclude(attempt, policy, result, stopped, timeout)


async def _invoke(
    attempt: _Attempt,
    task: asyncio.Task[Any],
    info: TaskInfo,
    timeout: float | None,
    *args: object,
) -> tuple[StoppedBy | None, object, Exception | None]:
    """Call the attempt's handler with *args* in *task*, under its lease and
    *timeout*, as *info* (a single task's and a batch's path alike).

    :return: what stopped it (:attr:`Running.stopped_by`), what it returned
        and what it raised; a stopped handler returns nothing
    :raises asyncio.CancelledError: the consumer is shutting down past its
        grace period, after handing the task back uncounted (it did not
        finish, so it goes back to the front of its group)
    """
    running = attempt.running
    context_token = CURRENT_TASK.set(info)
    running.frame = sys._getframe()
    started = time.perf_counter()
    running.begin(task, timeout)
    try:
        with attempt.observers.handler(info):
            result = await attempt.route.func(*args)
    except asyncio.CancelledError:
        stopped = running.end(cancelled=True)
        if stopped is None:
            attempt.outcome("back")
            raise
        return stopped, None, None
    except Exception as exc:  # noqa: BLE001 - any handler error is an outcome
        running.end(cancelled=False)
        return None, None, exc
    else:
        running.end(cancelled=False)
        return None, result, None
    finally:
        # Ended already on every path above; a BaseException none of them
        # takes must not leave the stop timer armed for the next task.
        running.end(cancelled=True)
        running.frame = None
        running.duration = time.perf_counter() - started
        CURRENT_TASK.reset(context_token)


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
    if problem := out_of_range(envelope):
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
    stopped: StoppedBy | None,
    timeout: float | None,
) -> None:
    """Turn a handler that returned, timed out or was stopped (*stopped*:
    by what, see :attr:`Running.stopped_by`) into its outcome."""
    running = attempt.running
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
    else:
        attempt.succeeded(result)


def _line_rest(head: Running, submit: Submit) -> None:
    head.line_members(lambda outcome: submit(outcome, None))
