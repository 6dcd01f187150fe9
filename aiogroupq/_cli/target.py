"""The target of ``aiogroupq worker module:attr``: importing it, checking
that it is a mapping of handlers or a Consumer factory, the ``schedules``
beside a mapping, and which options apply to which form."""

from __future__ import annotations

__all__ = ("Target", "UsageError", "check_options", "load_schedules", "load_target")

import argparse
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._store.keys import validate_queue_name
from .._work.handlers import build_routes
from .._work.schedule import Schedule
from ..consumer import Consumer
from ..errors import ConfigurationError

Target = Mapping[str, Any] | Callable[..., Any]


class UsageError(Exception):
    """A bad command line or target: reported in one line, exit status 2."""


def load_target(spec: str) -> Target:
    """Import ``module:attr`` and check that it is a mapping or a factory.

    :param spec: ``package.module:attribute`` (the attribute may be dotted)
    :raises UsageError: if it cannot be imported or is neither
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(
            f"expected module:attr (e.g. app.tasks:handlers), got {spec!r}"
        )
    # Like ``python -m``, so that the console script finds the user's modules.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:
        missing = getattr(exc, "name", None) or "?"
        if isinstance(exc, ModuleNotFoundError) and f"{module_name}.".startswith(
            f"{missing}."
        ):
            raise UsageError(f"cannot import module {module_name!r}: {exc}") from None
        raise UsageError(f"importing module {module_name!r} failed: {exc!r}") from exc
    for part in attr.split("."):
        if (obj := getattr(obj, part, _MISSING)) is _MISSING:
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
    if isinstance(obj, Consumer):
        raise UsageError(
            f"{spec} is a Consumer instance; expose the handlers mapping or a "
            "factory function that creates the Consumer instead"
        )
    if isinstance(obj, Mapping):
        try:
            build_routes(obj)
        except ConfigurationError as exc:
            raise UsageError(f"{spec}: {exc}") from None
        return obj
    if not callable(obj):
        raise UsageError(
            f"{spec} is a {type(obj).__name__}: expected a mapping of task type -> "
            "async handler, or a factory(*, redis_url, queue, concurrency) "
            "returning an aiogroupq.Consumer"
        )
    try:
        inspect.signature(obj).bind(redis_url="", queue=None, concurrency=1)
    except TypeError as exc:
        raise UsageError(
            f"{spec} must accept the keyword arguments redis_url, queue and "
            f"concurrency: {exc}"
        ) from None
    except ValueError:
        pass  # no signature to inspect (some builtins): let the call decide
    return obj


_MISSING: Final = object()


def load_schedules(spec: str) -> list[Schedule]:
    """The ``schedules`` beside the mapping *spec* names (``[]`` if none).

    :raises UsageError: if ``schedules`` is there but not a list of
        :class:`~aiogroupq.Schedule`
    """
    module_name, _, attr = spec.partition(":")
    parent: object = sys.modules[module_name]  # imported by load_target
    for part in attr.split(".")[:-1]:
        parent = getattr(parent, part)
    found = getattr(parent, "schedules", _MISSING)
    if found is _MISSING:
        return []
    where = ":".join((module_name, ".".join([*attr.split(".")[:-1], "schedules"])))
    if not isinstance(found, list | tuple) or not all(
        isinstance(item, Schedule) for item in found
    ):
        raise UsageError(
            f"{where} must be a list of aiogroupq.Schedule (it is passed on as "
            f"Consumer(schedules=...)), got {found!r}"
        )
    return list(found)


def check_options(spec: str, target: Target, args: argparse.Namespace) -> None:
    """Check the options against the target's form; for a mapping, also
    load the ``schedules`` beside it into ``args.schedules``.

    :raises UsageError: for a bad ``--queue``, a mapping without one, or an
        option that only a mapping takes given with a factory
    """
    try:
        if args.queue is not None:
            validate_queue_name(args.queue)
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
    if isinstance(target, Mapping):
        if args.queue is None:
            raise UsageError(f"--queue is required: {spec} is a mapping of handlers")
        args.schedules = load_schedules(spec)
    elif (args.lease_ttl, args.grace_period, args.name) != (None, None, None) or (
        args.allow_eviction
    ):
        raise UsageError(
            "--lease-ttl, --grace-period, --allow-eviction and --name apply to a "
            f"mapping of handlers; {spec} is a factory: set them in the Consumer "
            "it creates"
        )
