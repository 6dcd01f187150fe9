"""Handler registry: each handler is inspected once for the payload type it wants."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from ._codec import payload_decoder
from .errors import ConfigurationError

Handler = Callable[..., Awaitable[Any]]
"""``async def handler(payload)`` (or with no parameter)."""


@dataclass(frozen=True, slots=True)
class Route:
    """How to call one task type's handler."""

    handler: Handler
    decoder: msgspec.msgpack.Decoder[Any]
    payload_type: Any  # the annotation, or Any
    takes_payload: bool

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


def build_routes(handlers: Mapping[str, Handler]) -> dict[str, Route]:
    """Inspect every handler once.

    :raises ConfigurationError: for a non-async handler, one that takes more
        than one required parameter, or an annotation that cannot be resolved
    """
    if not isinstance(handlers, Mapping) or not handlers:
        raise ConfigurationError(
            "handlers must be a non-empty mapping of task type -> async function"
        )
    return {name: _route(name, handler) for name, handler in handlers.items()}


def _route(name: object, handler: Handler) -> Route:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"task type names must be non-empty str, got {name!r}")
    if not _is_async(handler):
        raise ConfigurationError(
            f"handler for {name!r} must be an async function, got {handler!r}"
        )
    try:
        params = [
            p
            for p in inspect.signature(handler).parameters.values()
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
        return Route(handler, payload_decoder(Any), Any, takes_payload=False)
    first = params[0]
    payload_type: Any = Any
    if first.annotation is not first.empty:
        target = inspect.unwrap(handler)
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
    return Route(handler, decoder, payload_type, takes_payload=True)
