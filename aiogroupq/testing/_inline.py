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
from ..task import TaskInfo, _current
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
    :param payload: what a producer would enqueue
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
    decoded = _through_redis(route, payload)
    if limit is None:
        limit = route.options.timeout
    info = TaskInfo(
        id=task_id or f"{time.time_ns() // 1_000_000:012x}{secrets.token_hex(8)}",
        type=task_type,
        group=group,
        attempt=attempt,
        max_attempts=max_attempts,
        fencing_token=fencing_token,
        enqueued_at=time.time() if enqueued_at is None else enqueued_at,
    )
    token = _current.set(info)
    try:
        with anyio.move_on_after(limit) as scope:
            if route.takes_payload:
                result = await route.func(decoded)
            else:
                result = await route.func()
    finally:
        _current.reset(token)
    if scope.cancelled_caught:
        raise TimeoutError(f"the attempt exceeded its timeout of {limit}s")
    if route.options.store_result:
        try:
            encode_payload(result)
        except EncodeFailure as exc:
            raise ResultEncodeError(result, f"UnencodableResult: {exc}") from exc
    return result


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
