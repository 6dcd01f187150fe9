"""Run one handler in the current event loop, as a consumer would, without Redis."""

from __future__ import annotations

import secrets
import time
from datetime import timedelta
from typing import Any

import anyio
import msgspec

from .._store import validate as _validate
from .._store.codec import EncodeFailure, encode_payload
from .._work.handlers import Handler, HandlerFunc, Route, build_routes
from ..errors import InvalidTaskError, UnencodablePayloadError
from ..task import CURRENT_BATCH, CURRENT_TASK, TaskInfo
from ._errors import PayloadDecodeError, ResultEncodeError


async def run_inline(
    handler: HandlerFunc | Handler,
    payload: Any = None,
    *,
    task_type: str = "task",
    task_id: str | None = None,
    group: str | None = None,
    attempt: int = 1,
    max_attempts: int = 3,
    fencing_token: int = 1,
    timeout: float | timedelta | None = None,
    enqueued_at: float | None = None,
) -> Any:
    """Run *handler* once on *payload* in this event loop, the way a consumer
    runs it, and return what it returns.

    The payload is encoded to MessagePack and decoded into the type the
    handler declares, with the decoder a consumer builds for it, so a payload
    that would not survive the trip through Redis fails here too.
    :func:`aiogroupq.current_task` works inside the handler and returns a
    :class:`~aiogroupq.TaskInfo` made of the arguments below. The handler's
    exceptions (:class:`aiogroupq.Retry` included) propagate unchanged.

    :param handler: ``async def handler(payload)``, or an
        :class:`aiogroupq.Handler` (its ``timeout`` applies)
    :param payload: what a producer would enqueue; for a batch handler
        (``Handler(batch_size=N)``), a list of 1 to N payloads, run as one
        batch of a group (``current_batch()`` works, the first task's info
        is ``current_task()``, the others' ids are random)
    :param task_type: :attr:`TaskInfo.type`
    :param task_id: :attr:`TaskInfo.id` (default: a random one)
    :param group: :attr:`TaskInfo.group`
    :param attempt: :attr:`TaskInfo.attempt`, from 1
    :param max_attempts: :attr:`TaskInfo.max_attempts`
    :param fencing_token: :attr:`TaskInfo.fencing_token`
    :param timeout: seconds the attempt may run (default: the handler's
        ``timeout``, else none), as the task's ``timeout`` would
    :param enqueued_at: :attr:`TaskInfo.enqueued_at` (default: now)
    :return: the handler's return value
    :raises aiogroupq.ConfigurationError: if a consumer would refuse the handler
    :raises aiogroupq.InvalidTaskError: for an argument a producer would refuse
        (an unencodable payload, a bad group, task type, attempt or timeout)
    :raises PayloadDecodeError: if the payload does not decode into the
        handler's type (a consumer would dead-letter the task)
    :raises ResultEncodeError: if a ``store_result=True`` handler returns a
        value MessagePack cannot encode (likewise)
    :raises TimeoutError: if the attempt runs past its timeout
    """
    task_type = _validate.name("task_type", task_type)
    route = build_routes({task_type: handler})[task_type]
    group = _validate.group(group)
    limit = _validate.seconds("timeout", timeout, allow_zero=False)
    _validate.max_attempts(max_attempts)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidTaskError("attempt", f"{attempt!r} must be an int >= 1")
    batch = route.options.batch_size
    payloads = [payload] if batch is None else _batch_of(payload, batch)
    decoded = [_through_redis(route, p) for p in payloads]
    if limit is None:
        limit = route.options.timeout
    enqueued = time.time() if enqueued_at is None else enqueued_at
    infos = [
        TaskInfo(
            id=(task_id if i == 0 and task_id else _task_id()),
            type=task_type,
            group=group,
            attempt=attempt if i == 0 else 1,
            max_attempts=max_attempts,
            fencing_token=fencing_token + i,
            enqueued_at=enqueued,
        )
        for i in range(len(payloads))
    ]
    token = CURRENT_TASK.set(infos[0])
    batch_token = CURRENT_BATCH.set(infos) if batch is not None else None
    try:
        with anyio.move_on_after(limit) as scope:
            if batch is not None:
                result = await route.func(decoded)
            elif route.takes_payload:
                result = await route.func(decoded[0])
            else:
                result = await route.func()
    finally:
        if batch_token is not None:
            CURRENT_BATCH.reset(batch_token)
        CURRENT_TASK.reset(token)
    if scope.cancelled_caught:
        raise TimeoutError(f"the attempt exceeded its timeout of {limit}s")
    if route.options.store_result:
        results = [result]
        if batch is not None and result is not None:
            if not isinstance(result, list) or len(result) != len(payloads):
                raise ResultEncodeError(
                    result,
                    f"a batch handler storing results returns None or a list of "
                    f"one result per task ({len(payloads)})",
                )
            results = result
        for one in results:
            try:
                encode_payload(one)
            except EncodeFailure as exc:
                raise ResultEncodeError(one, f"UnencodableResult: {exc}") from exc
    return result


def _task_id() -> str:
    return f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}"


def _batch_of(payload: Any, batch_size: int) -> list[Any]:
    """A batch handler's payloads: a list of 1 to *batch_size*."""
    if not isinstance(payload, list | tuple) or not 1 <= len(payload) <= batch_size:
        raise InvalidTaskError(
            "payload",
            f"a batch handler (batch_size={batch_size}) runs on a list of 1 to "
            f"{batch_size} payloads, got {payload!r:.80}",
        )
    return list(payload)


def _through_redis(route: Route, payload: Any) -> Any:
    """*payload* as the handler would receive it: encoded as a producer
    encodes it, decoded with the consumer's decoder for the handler."""
    try:
        encoded = encode_payload(payload)
    except EncodeFailure as exc:
        raise UnencodablePayloadError(payload, str(exc)) from exc
    try:
        return route.decoder.decode(encoded)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        # The consumer's dead-letter reason, word for word (see _work/runner.py).
        reason = (
            f"InvalidPayload: payload does not decode into "
            f"{route.describe_type()}: {exc}"
        )
        raise PayloadDecodeError(payload, reason) from exc
