"""Handler registry: each handler is inspected once for the payload type it
wants, together with its task type's options (:class:`Handler`)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import msgspec

from .._store.codec import payload_decoder
from .._store.validate import setting_seconds
from ..errors import ConfigurationError

HandlerFunc = Callable[..., Awaitable[Any]]
"""``async def handler(payload)`` (or with no parameter)."""


class Handler:
    """A handler with options for its task type; pass it as a ``handlers``
    value instead of the bare function.

    :param func: ``async def handler(payload)`` (or with no parameter)
    :param timeout: seconds one attempt may run when the task sets none
    :param retry_backoff: seconds before the first retry (doubling, with
        jitter), instead of the consumer's
    :param retry_backoff_max: cap of the retry delay, instead of the consumer's
    :param no_retry: exception types that dead-letter the task at once
    :param store_result: keep the handler's return value (MessagePack) for
        :meth:`Producer.result` during the retention window
    :param on_dead: ``"continue"`` (default): a dead-lettered task's group
        goes on with its next task; ``"halt"``: the group stops behind it until
        :meth:`Admin.requeue_dead` or :meth:`Admin.release_group`.
        Dead-lettering by lease expiry on the last attempt always continues.
    :raises ConfigurationError: for an unusable option
    """

    __slots__ = (
        "func",
        "no_retry",
        "on_dead",
        "retry_backoff",
        "retry_backoff_max",
        "store_result",
        "timeout",
    )

    def __init__(
        self,
        func: HandlerFunc,
        *,
        timeout: float | timedelta | None = None,
        retry_backoff: float | timedelta | None = None,
        retry_backoff_max: float | timedelta | None = None,
        no_retry: tuple[type[BaseException], ...] = (),
        store_result: bool = False,
        on_dead: Literal["continue", "halt"] = "continue",
    ) -> None:
        self.func: HandlerFunc = func
        self.timeout: float | None = _optional("timeout", timeout, minimum=0.001)
        self.retry_backoff: float | None = _optional("retry_backoff", retry_backoff)
        self.retry_backoff_max: float | None = _optional(
            "retry_backoff_max", retry_backoff_max
        )
        if not isinstance(no_retry, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in no_retry
        ):
            raise ConfigurationError(
                f"no_retry must be a tuple of exception types, got {no_retry!r}"
            )
        self.no_retry: tuple[type[BaseException], ...] = no_retry
        self.store_result: bool = bool(store_result)
        if on_dead not in ("continue", "halt"):
            raise ConfigurationError(
                f"on_dead must be 'continue' or 'halt', got {on_dead!r}"
            )
        self.on_dead: Literal["continue", "halt"] = on_dead

    def __repr__(self) -> str:
        return f"aiogroupq.Handler({self.func!r}, on_dead={self.on_dead!r})"


def _optional(
    name: str, value: float | timedelta | None, *, minimum: float = 0.0
) -> float | None:
    return None if value is None else setting_seconds(name, value, minimum=minimum)


@dataclass(frozen=True, slots=True)
class Route:
    """How to call one task type's handler."""

    func: HandlerFunc
    decoder: msgspec.msgpack.Decoder[Any]
    payload_type: Any  # the annotation, or Any
    takes_payload: bool
    options: Handler

    def describe_type(self) -> str:
        """The payload type as a reader would write it."""
        t = self.payload_type
        return getattr(t, "__name__", None) or repr(t)


def _is_async(func: object) -> bool:
    if not callable(func):
        return False
    inner = inspect.unwrap(func)
    if inspect.iscoroutinefunction(inner):
        return True
    if isinstance(inner, functools.partial):
        return _is_async(inner.func)
    # A callable object whose __call__ is async.
    return inspect.iscoroutinefunction(type(inner).__call__)


def build_routes(handlers: Mapping[str, HandlerFunc | Handler]) -> dict[str, Route]:
    """Inspect every handler once.

    :raises ConfigurationError: for a non-async handler, one that takes more
        than one required parameter, or an annotation that cannot be resolved
    """
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            "handlers must be a non-empty mapping of task type -> async function"
        )
    return {name: _route(name, handler) for name, handler in handlers.items()}


def _route(name: object, handler: HandlerFunc | Handler) -> Route:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task type names must be non-empty str, got {name!r}")
    options = handler if isinstance(handler, Handler) else Handler(handler)
    func = options.func
    if not _is_async(func):
        raise ConfigurationError(
            f"handler for {name!r} must be an async function, got {func!r}"
        )
    try:
        params = [
            p
            for p in inspect.signature(func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot inspect handler for {name!r}: {exc}") from exc
    required = [p for p in params if p.default is p.empty]
    if len(required) > 1:
        raise ConfigurationError(
            f"handler for {name!r} must take one payload parameter, "
            f"it requires {len(required)}"
        )
    if not params:
        return Route(func, payload_decoder(Any), Any, False, options)
    first = params[0]
    payload_type: Any = Any
    if first.annotation is not first.empty:
        target: Any = inspect.unwrap(func)
        if isinstance(target, functools.partial):
            target = inspect.unwrap(target.func)
        if not inspect.isfunction(target) and not inspect.ismethod(target):
            target = type(target).__call__
        try:
            hints = typing.get_type_hints(target, include_extras=True)
        except Exception as exc:
            raise ConfigurationError(
                f"cannot resolve the payload annotation of the handler for "
                f"{name!r}: {exc}"
            ) from exc
        payload_type = hints.get(first.name, Any)
    try:
        decoder = payload_decoder(payload_type)
    except TypeError as exc:
        raise ConfigurationError(
            f"the payload type {payload_type!r} of the handler for {name!r} "
            f"is not supported by msgspec: {exc}"
        ) from exc
    return Route(func, decoder, payload_type, True, options)
