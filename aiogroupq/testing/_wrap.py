"""Wrapping a handler so that a recorder sees each run, without changing how
the consumer routes and decodes for it."""

from __future__ import annotations

import functools
from typing import Any, Protocol

from .._work.handlers import Handler, HandlerFunc
from ..errors import BatchFailed
from ..task import TaskInfo, current_batch, current_task


class RunHooks(Protocol):
    """Called inside the handler's context, once per task it runs (each task
    of a batch, in order)."""

    def started(self, info: TaskInfo) -> None: ...

    def ended(
        self, info: TaskInfo, result: Any, error: BaseException | None
    ) -> None: ...


def wrap_handler(handler: HandlerFunc | Handler, hooks: RunHooks) -> Handler:
    """*handler* with *hooks* around each run, its options kept.

    A batch handler's tasks are seen one after the other, as the batch runs
    them (it holds their group throughout): the first starts before the
    call, each next one when the one before it ends. Those the batch hands
    back unjudged (after a :class:`~aiogroupq.BatchFailed`'s failed task,
    or all but the first after another error) are not seen: they run again.

    ``functools.wraps`` sets ``__wrapped__``, so the route is built from the
    original's signature and annotations: the payload decodes exactly as it
    would without the wrapper.
    """
    options = handler if isinstance(handler, Handler) else Handler(handler)
    func = options.func
    batch = options.batch_size is not None

    def seen(
        infos: list[TaskInfo], ends: list[tuple[Any, BaseException | None]]
    ) -> None:
        for place, (result, error) in enumerate(ends):
            if place:
                hooks.started(infos[place])
            hooks.ended(infos[place], result, error)

    @functools.wraps(func)
    async def run(*args: Any) -> Any:
        infos = current_batch() if batch else [current_task()]
        hooks.started(infos[0])
        try:
            result = await func(*args)
        except BatchFailed as exc:
            done = min(exc.done, len(infos))
            ends: list[tuple[Any, BaseException | None]] = [(None, None)] * done
            if done < len(infos):
                ends.append((None, exc.error))
            seen(infos, ends)
            raise
        except BaseException as exc:
            seen(infos, [(None, exc)])
            raise
        if batch and isinstance(result, list) and len(result) == len(infos):
            seen(infos, [(each, None) for each in result])
        else:
            seen(infos, [(result if not batch else None, None)] * len(infos))
        return result

    return Handler(
        run,
        timeout=options.timeout,
        retry_backoff=options.retry_backoff,
        retry_backoff_max=options.retry_backoff_max,
        no_retry=options.no_retry,
        store_result=options.store_result,
        on_dead=options.on_dead,
        batch_size=options.batch_size,
        batch_wait=options.batch_wait,
    )
