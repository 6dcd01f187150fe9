"""``aiogroupq worker module:attr`` consumes until SIGTERM or SIGINT. *attr*
(dots allowed) names either:

(a) a mapping of task type -> async handler. The worker runs
    ``Consumer(--redis-url, queue=--queue, handlers=attr, concurrency=...,
    lease_ttl=..., grace_period=..., name=..., partition_replicas=...)``;
    ``--queue`` is required.
    With ``--name``, a worker restarted under the same name resumes its
    unfinished tasks at once instead of after their leases expire::

        handlers = {"import_rows": import_rows}    # in myapp/tasks.py
        $ aiogroupq worker myapp.tasks:handlers --queue imports

    A ``schedules`` list of ``aiogroupq.Schedule`` beside the mapping (in
    the same module or object) is passed on as ``Consumer(schedules=...)``::

        schedules = [aiogroupq.Schedule("nightly", "import_rows",
                                        cron="0 3 * * *", tz="Europe/Paris")]

(b) a factory, for full control: ``factory(*, redis_url, queue, concurrency)``
    (``queue`` is ``None`` without ``--queue``) returning a Consumer, an
    awaitable of one, or an async context manager yielding one (to open and
    close what the handlers need around it). The worker enters the Consumer,
    so do not enter it yourself; set its lease TTL, grace period and
    schedules there::

        def make_consumer(*, redis_url, queue, concurrency):
            return aiogroupq.Consumer(redis_url, queue=queue or "imports",
                                      handlers=handlers, concurrency=concurrency)
        $ aiogroupq worker myapp.tasks:make_consumer

While Redis cannot be reached (down, not started yet, not answering), the
worker logs a warning and tries again, waiting 0.5 s, then twice as long each
time up to 30 s, until it is ready or stopped. Refused credentials, a bad
database number or an eviction policy other than ``noeviction`` (see
``--allow-eviction``) are configuration errors: the worker exits at once.

The event loop is uvloop where it is installed (``pip install
'aiogroupq[uvloop]'``), else asyncio's own; ``--loop asyncio`` or ``--loop
uvloop`` decides instead (the ready line names the loop).

A first SIGTERM or SIGINT stops claiming and lets running handlers finish
within the grace period; a second one cancels them. Unfinished tasks are
handed back to the front of their groups. ``--processes N`` runs N worker
processes, forwards SIGTERM and SIGINT to them and waits; when one ends by
itself the others are stopped. Exit status: 0 after a requested stop, 2 for a
bad command line, target or configuration, 1 when a worker failed.
"""
# The docstring above is the description ``aiogroupq worker --help`` prints.

from __future__ import annotations

__all__ = ("run",)

import argparse
import asyncio
import inspect
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from typing import TYPE_CHECKING, Any, Final

import anyio
from redis.exceptions import RedisError

from .._store.connection import safe_url
from ..consumer import Consumer
from ..errors import (
    ConfigurationError,
    CorruptQueueError,
    MissingExtraError,
    RedisUnavailableError,
)
from .target import Target, UsageError, check_options, load_target

if TYPE_CHECKING:
    from .._telemetry.events import Observer

logger: logging.Logger = logging.getLogger("aiogroupq.cli")

_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
#: how often a supervised worker checks that its supervisor is still there
_PARENT_POLL: Final = 0.5
#: how a worker we stopped may end: one stopped before it installed its
#: signal handlers dies of the signal, which is still a clean stop
_STOPPED: Final = frozenset({0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGINT})
#: seconds between attempts to start while Redis is unreachable: the first
#: wait, then doubling up to the last
_RETRY_FIRST, _RETRY_MAX = 0.5, 30.0


@asynccontextmanager
async def _open_consumer(
    spec: str,
    target: Target,
    args: argparse.Namespace,
    observers: tuple[Observer, ...] = (),
) -> AsyncIterator[Consumer]:
    # A ConfigurationError raised here becomes a one-line error in _worker.
    if isinstance(target, Mapping):
        options = {
            "lease_ttl": args.lease_ttl,
            "grace_period": args.grace_period,
            "name": args.name,
            "allow_eviction": args.allow_eviction or None,
            "partition_replicas": args.partition_replicas,
        }
        made: Any = Consumer(
            args.redis_url,
            queue=args.queue,
            handlers=target,
            concurrency=args.concurrency,
            schedules=args.schedules,
            **{name: value for name, value in options.items() if value is not None},
        )
    else:
        made = target(
            redis_url=args.redis_url, queue=args.queue, concurrency=args.concurrency
        )
        if inspect.isawaitable(made):
            made = await made
    if isinstance(made, Consumer):
        for observer in observers:
            made._observe(observer)
        async with made:
            yield made
    elif isinstance(made, AbstractAsyncContextManager):
        async with made as consumer:
            if not isinstance(consumer, Consumer):
                raise UsageError(f"{spec} yielded {consumer!r}, not a Consumer")
            for observer in observers:
                consumer._observe(observer)
            async with consumer:
                yield consumer
    else:
        raise UsageError(f"{spec} returned {made!r}, not an aiogroupq.Consumer")


# -- one worker process --------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Run ``aiogroupq worker``; return the exit status.

    :raises UsageError: for a bad target or option, or an unusable
        ``--redis-url``
    """
    target = load_target(args.target)
    check_options(args.target, target, args)
    if args.partition_replicas is not None and not isinstance(target, Mapping):
        raise UsageError(
            f"--partition-replicas applies to a mapping of handlers; {args.target} "
            "is a factory: set partition_replicas in the Consumer it creates"
        )
    if args.processes > 1:
        return _supervise(args)
    use_uvloop = _uvloop_wanted(args.loop)
    try:
        anyio.run(
            _serve,
            args.target,
            target,
            args,
            backend_options={"use_uvloop": use_uvloop},
        )
    except BaseException as exc:
        # Task groups wrap what they raise; unwrap single exceptions.
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        if isinstance(exc, UsageError):
            raise exc from exc.__cause__
        if isinstance(exc, ConfigurationError):  # e.g. an unusable --redis-url
            raise UsageError(f"Redis at {safe_url(args.redis_url)}: {exc}") from None
        if isinstance(exc, KeyboardInterrupt):
            return 128 + signal.SIGINT
        if isinstance(exc, RedisError | OSError):
            logger.critical(
                "worker stopped: Redis at %s failed: %s",
                safe_url(args.redis_url),
                exc,
                exc_info=exc if args.verbose else None,
            )
        elif isinstance(exc, CorruptQueueError):
            # Its message names the key and the way out: a line, not a trace.
            logger.critical(
                "worker stopped: %s", exc, exc_info=exc if args.verbose else None
            )
        else:
            logger.critical("worker failed", exc_info=exc)
        return 1
    return 0


def _uvloop_wanted(choice: str) -> bool:
    """Whether to run on uvloop: ``--loop uvloop`` insists (a usage error
    where it is missing), ``auto`` takes it where it is installed."""
    if choice == "asyncio":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise UsageError(
                "--loop uvloop: uvloop is not installed "
                "(pip install 'aiogroupq[uvloop]'), or use --loop asyncio"
            ) from None
        return False
    return True


async def _serve(spec: str, target: Target, args: argparse.Namespace) -> None:
    stop = anyio.Event()
    # Cancelled by a second signal: cuts the consumer's grace period short.
    run_scope = anyio.CancelScope()
    with anyio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_signals, signals, stop, run_scope)
            if args.parent_pid is not None:
                tg.start_soon(_watch_parent, args.parent_pid, stop)
            try:
                with run_scope, _metrics(args) as observers:
                    if observers and args.queue is not None:
                        tg.start_soon(_queue_gauges, args, observers[0])
                    await _consume(spec, target, args, stop, observers)
            finally:
                tg.cancel_scope.cancel()


async def _queue_gauges(args: argparse.Namespace, observer: Observer) -> None:
    """With --metrics-port: keep the queue's gauges (task counts, the oldest
    waiting work, halted and paused groups, live consumers), from one
    ``Admin.stats()`` call every few seconds (each reads the whole queue, so
    any one worker's metrics show it all)."""
    from ..admin import Admin
    from ..prometheus import PrometheusObserver

    assert isinstance(observer, PrometheusObserver)
    async with Admin(args.redis_url, queue=args.queue) as admin:
        await observer.watch_queue(args.queue, admin.stats)


async def _consume(
    spec: str,
    target: Target,
    args: argparse.Namespace,
    stop: anyio.Event,
    observers: tuple[Observer, ...],
) -> None:
    """Run the consumer until *stop*; while Redis is unreachable, try again
    with backoff (a worker may well start before its Redis)."""
    wait = _RETRY_FIRST
    while not stop.is_set():
        try:
            async with _open_consumer(spec, target, args, observers) as consumer:
                logger.info(
                    "worker ready: %s on queue %r (event loop: %s)",
                    spec,
                    consumer.queue,
                    type(asyncio.get_running_loop()).__module__.split(".")[0],
                )
                await stop.wait()
                return
        except RedisUnavailableError as exc:
            logger.warning(
                "Redis at %s is unreachable (%s); trying again in %.1f s",
                safe_url(args.redis_url),
                exc.detail,
                wait,
            )
        with anyio.move_on_after(wait):
            await stop.wait()
        wait = min(wait * 2, _RETRY_MAX)


@contextmanager
def _metrics(args: argparse.Namespace) -> Iterator[tuple[Observer, ...]]:
    """With --metrics-port: serve Prometheus metrics while the worker runs
    (the ``*_created`` series only with --metrics-created, see
    :func:`~aiogroupq.prometheus.serve`)."""
    if args.metrics_port is None:
        yield ()
        return
    try:
        from ..prometheus import PrometheusObserver, serve
    except MissingExtraError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None
    try:
        server = serve(args.metrics_port, created=args.metrics_created)
    except OSError as exc:
        raise UsageError(f"--metrics-port {args.metrics_port}: {exc}") from None
    logger.info("serving Prometheus metrics on port %d", server.port)
    try:
        yield (PrometheusObserver(),)
    finally:
        server.close()


async def _watch_signals(
    signals: AsyncIterator[signal.Signals],
    stop: anyio.Event,
    run_scope: anyio.CancelScope,
) -> None:
    async for signum in signals:
        if stop.is_set():
            logger.warning("%s again: cancelling running tasks", signum.name)
            run_scope.cancel()
        else:
            logger.info(
                "%s: finishing running tasks (send it again to stop at once)",
                signum.name,
            )
            stop.set()


async def _watch_parent(parent_pid: int, stop: anyio.Event) -> None:
    while True:  # nothing notifies us when our parent dies: poll
        await anyio.sleep(_PARENT_POLL)
        if os.getppid() != parent_pid:
            break
    logger.warning("the supervising process %d is gone: stopping", parent_pid)
    stop.set()


# -- several worker processes --------------------------------------------------


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _supervise(args: argparse.Namespace) -> int:
    children: list[subprocess.Popen[bytes]] = []
    stopping = False
    first_to_end: subprocess.Popen[bytes] | None = None

    def stop_children(signum: int, frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                with suppress(ProcessLookupError):
                    child.send_signal(signum)

    previous = {
        signum: signal.signal(signum, stop_children) for signum in _STOP_SIGNALS
    }
    try:
        # The same command line: later options override earlier ones.
        argv = [sys.executable, "-m", "aiogroupq", *args.argv, "--processes", "1"]
        argv += ["--parent-pid", str(os.getpid())]
        while len(children) < args.processes and not stopping:
            named = (
                []
                if args.name is None
                else ["--name", f"{args.name}-{len(children) + 1}"]
            )
            if args.metrics_port is not None:  # one port each
                named += ["--metrics-port", str(args.metrics_port + len(children))]
            # Own process group: a terminal's Ctrl-C reaches only us, and we
            # forward it once (twice would cut the grace period short).
            children.append(subprocess.Popen(argv + named, process_group=0))
        logger.info("started %d worker processes", len(children))
        while any(child.poll() is None for child in children):
            ended = [child for child in children if child.returncode is not None]
            if not stopping and ended:
                first_to_end = ended[0]
                logger.log(
                    logging.ERROR if first_to_end.returncode else logging.WARNING,
                    "worker process %d exited with status %d: stopping the others",
                    first_to_end.pid,
                    _exit_status(first_to_end.returncode),
                )
                stop_children(signal.SIGTERM)
            elif not stopping and args.parent_pid not in (None, os.getppid()):
                logger.warning("the supervising process is gone: stopping")
                stop_children(signal.SIGTERM)
            time.sleep(0.1)  # a supervisor has nothing better to do
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for child in children:
            if child.poll() is None:  # we are failing ourselves: leave no orphans
                child.kill()
                child.wait()
    failed = 0
    for child in children:
        code = child.returncode
        if code != 0 and (child is first_to_end or code not in _STOPPED):
            status = _exit_status(code)
            logger.error("worker process %d failed with status %d", child.pid, status)
            failed = failed or status
    return failed
