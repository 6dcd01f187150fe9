"""Handler registry: each handler is inspected once for the payload type it
wants, together with its task type's options (:class:`Handler`)."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

import msgspec

from .._limits import START_WINDOW
from .._store.codec import payload_decoder
from .._store.validate import setting_seconds
from ..errors import ConfigurationError

HandlerFunc = Callable[..., Awaitable[Any]]
"""``async def handler(payload)`` (or with no parameter)."""

#: the largest batch_size: a claim takes a batch in one script call
MAX_BATCH_SIZE: Final = 1000
#: the longest batch_wait, in seconds: a task of a group starts within
#: START_WINDOW of its claim or goes back (a pause of its group waits that
#: long for what was claimed before it), so a batch may wait only less
MAX_BATCH_WAIT: Final = START_WINDOW - 1.0


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
    :param batch_size: make it a batch handler: ``func`` receives a list of
        up to this many payloads (1 to 1000), consecutive tasks of one group
        in enqueue order, run as one (see "Ordered group batches" in
        docs/batches.md); a task without a group comes as a batch of one.
        With *store_result*, ``func`` returns None or a list of one result
        per task
    :param batch_wait: seconds (at most 2) a batch that is not full waits
        for more tasks of its group before its handler starts (only with
        *batch_size*)
    :raises ConfigurationError: for an unusable option
    """

    __slots__ = (
        "batch_size",
        "batch_wait",
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
        batch_size: int | None = None,
        batch_wait: float | timedelta = 0.0,
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
        if batch_size is not None and (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, int)
            or not 1 <= batch_size <= MAX_BATCH_SIZE
        ):
            raise ConfigurationError(
                f"batch_size must be an int from 1 to {MAX_BATCH_SIZE}, "
                f"got {batch_size!r}"
            )
        #: the most tasks per call of a batch handler; None: not one
        self.batch_size: int | None = batch_size
        wait = setting_seconds("batch_wait", batch_wait)
        if wait > MAX_BATCH_WAIT:
            raise ConfigurationError(
                f"batch_wait must be at most {MAX_BATCH_WAIT:g} seconds (a task "
                f"of a group starts within {START_WINDOW:g}s of its claim), "
                f"got {batch_wait!r}"
            )
        if wait and batch_size is None:
            raise ConfigurationError("batch_wait needs batch_size (a batch handler)")
        self.batch_wait: float = wait

    def __repr__(self) -> str:
        if self.batch_size is not None:
            return (
                f"aiogroupq.Handler({self.func!r}, on_dead={self.on_dead!r}, "
                f"batch_size={self.batch_size!r})"
            )
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


def _item_type(name: str, annotation: Any) -> Any:
    """A batch handler's payload type: X of its ``list[X]`` (or
    ``Sequence[X]``) annotation, Any for a bare or Any one."""
    if annotation is Any:
        return Any
    origin = typing.get_origin(annotation)
    if annotation in (list, Sequence) or origin in (list, Sequence):
        args = typing.get_args(annotation)
        return args[0] if args else Any
    raise ConfigurationError(
        f"the batch handler for {name!r} takes a list of payloads: annotate "
        f"it list[X], not {annotation!r}"
    )


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
        if options.batch_size is not None:
            raise ConfigurationError(
                f"batch handler for {name!r} must take one parameter, the "
                "list of payloads"
            )
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
        if options.batch_size is not None:
            payload_type = _item_type(name, payload_type)
    try:
        decoder = payload_decoder(payload_type)
    except TypeError as exc:
        raise ConfigurationError(
            f"the payload type {payload_type!r} of the handler for {name!r} "
            f"is not supported by msgspec: {exc}"
        ) from exc
    return Route(func, decoder, payload_type, True, options)
