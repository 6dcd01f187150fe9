"""Wrapping a handler so that a recorder sees each run, without changing how
the consumer routes and decodes for it."""

from __future__ import annotations

import functools
from typing import Any, Protocol

from .._work.handlers import Handler, HandlerFunc


class RunHooks(Protocol):
    """Called inside the handler's context (``current_task()`` works)."""

    def started(self) -> None: ...

    def ended(self, result: Any, error: BaseException | None) -> None: ...


def wrap_handler(handler: HandlerFunc | Handler, hooks: RunHooks) -> Handler:
    """*handler* with *hooks* around each run, its options kept.

    ``functools.wraps`` sets ``__wrapped__``, so the route is built from the
    original's signature and annotations: the payload decodes exactly as it
    would without the wrapper.
    """
    options = handler if isinstance(handler, Handler) else Handler(handler)
    func = options.func

    @functools.wraps(func)
    async def run(*args: Any) -> Any:
        hooks.started()
        try:
            result = await func(*args)
        except BaseException as exc:
            hooks.ended(None, exc)
            raise
        hooks.ended(result, None)
        return result

    return Handler(
        run,
        timeout=options.timeout,
        retry_backoff=options.retry_backoff,
        retry_backoff_max=options.retry_backoff_max,
        no_retry=options.no_retry,
        store_result=options.store_result,
        on_dead=options.on_dead,
    )
