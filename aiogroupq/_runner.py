"""One claimed task's life on a consumer: decode, run the handler under its
lease and timeout, and turn what happened into an outcome for ``finish.lua``."""

from __future__ import annotations

import logging
import random
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import anyio
import msgspec

from ._codec import unpack
from ._scripts import Claimed, Outcome
from .errors import Retry
from .task import Envelope, TaskInfo, _current

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._handlers import Route

logger = logging.getLogger("aiogroupq.consumer")

#: longest traceback kept with a dead letter, in characters
MAX_TRACEBACK: Final = 16_000


@dataclass(eq=False)
class Running:
    """A task this consumer holds, from claim until its outcome is recorded."""

    claimed: Claimed
    # Cancelled by the heartbeat when the lease is lost; its deadline is the
    # local lease deadline, so a consumer that cannot renew stops by itself.
    lease_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    lost: bool = False


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


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__qualname__}: {exc}"


def _trace(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-MAX_TRACEBACK:]


async def run_task(
    running: Running,
    routes: dict[str, Route],
    policy: RetryPolicy,
    submit: Callable[[Outcome], None],
) -> None:
    """Run one claimed task and submit its outcome.

    Never raises for anything the task does, except the cancellation of the
    consumer itself (shutdown), after handing the task back.
    """
    claimed = running.claimed

    def outcome(kind: str, arg1: str | int = "", arg2: str = "") -> None:
        submit(Outcome(claimed.id, claimed.token, kind, arg1, arg2))

    try:
        envelope = unpack(claimed.envelope)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        logger.error("task %s has a corrupt envelope: %s", claimed.id, exc)
        outcome("dead", f"corrupt envelope: {exc}")
        return
    route = routes.get(envelope.type)
    if route is None:
        logger.error(
            "no handler for task type %r (task %s)",
            envelope.type,
            claimed.id,
            extra={"task_id": claimed.id, "group": envelope.group},
        )
        outcome(
            "dead",
            f"UnknownTaskType: no handler for task type {envelope.type!r}; "
            f"this consumer handles {sorted(routes)!r}",
        )
        return
    try:
        payload = route.decoder.decode(envelope.payload)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        logger.error(
            "payload of task %s does not decode into %s: %s",
            claimed.id,
            route.describe_type(),
            exc,
            extra={"task_id": claimed.id, "group": envelope.group},
        )
        outcome(
            "dead",
            f"InvalidPayload: payload does not decode into {route.describe_type()}: "
            f"{exc}",
        )
        return

    info = TaskInfo(
        id=claimed.id,
        type=envelope.type,
        group=envelope.group,
        attempt=claimed.attempt,
        max_attempts=envelope.max_attempts,
        fencing_token=claimed.token,
        enqueued_at=envelope.enqueued_ms / 1000,
    )
    timeout = None if envelope.timeout_ms is None else envelope.timeout_ms / 1000
    context_token = _current.set(info)
    timed_out = False
    try:
        with running.lease_scope:
            with anyio.move_on_after(timeout) as timeout_scope:
                if route.takes_payload:
                    await route.handler(payload)
                else:
                    await route.handler()
            timed_out = timeout_scope.cancelled_caught
    except anyio.get_cancelled_exc_class():
        # The consumer is shutting down past its grace period: the task did
        # not finish, so it goes back to the front of its group, uncounted.
        outcome("back")
        raise
    except Retry as exc:
        _failed(envelope, claimed, policy, outcome, exc, requested=exc.delay)
        return
    except Exception as exc:  # noqa: BLE001 - any handler error is an outcome
        _failed(envelope, claimed, policy, outcome, exc, requested=None)
        return
    finally:
        _current.reset(context_token)

    if running.lease_scope.cancelled_caught:
        if running.lost:
            logger.warning(
                "lease of task %s was lost; its handler was cancelled and its "
                "result is dropped",
                claimed.id,
                extra={"task_id": claimed.id, "group": envelope.group},
            )
            return
        # Our own lease deadline passed without a renewal: we may still hold
        # the task, so count a failed attempt (refused if it was recovered).
        stalled = TimeoutError("the lease could not be renewed in time")
        _failed(envelope, claimed, policy, outcome, stalled, requested=0.0)
    elif timed_out:
        late = TimeoutError(f"the attempt exceeded its timeout of {timeout}s")
        _failed(envelope, claimed, policy, outcome, late, requested=None)
    else:
        logger.debug("task %s succeeded", claimed.id)
        outcome("ok")


def _failed(
    envelope: Envelope,
    claimed: Claimed,
    policy: RetryPolicy,
    outcome: Callable[[str, str | int, str], None],
    exc: BaseException,
    *,
    requested: float | None,
) -> None:
    extra = {"task_id": claimed.id, "group": envelope.group}
    if claimed.attempt >= envelope.max_attempts:
        logger.error(
            "task %s failed on its last attempt (%d of %d); dead-lettered",
            claimed.id,
            claimed.attempt,
            envelope.max_attempts,
            exc_info=exc if not isinstance(exc, Retry) else None,
            extra=extra,
        )
        reason = (
            "Retry requested on the last attempt"
            if isinstance(exc, Retry)
            else _reason(exc)
        )
        outcome("dead", reason, _trace(exc))
        return
    delay = policy.delay(claimed.attempt) if requested is None else requested
    if isinstance(exc, Retry):
        logger.info("task %s asked to retry in %.3fs", claimed.id, delay, extra=extra)
    else:
        logger.error(
            "task %s failed (attempt %d of %d); retrying in %.3fs",
            claimed.id,
            claimed.attempt,
            envelope.max_attempts,
            delay,
            exc_info=exc,
            extra=extra,
        )
    outcome("retry", _ms(delay), _reason(exc))
