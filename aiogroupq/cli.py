"""The ``aiogroupq`` command line (also ``python -m aiogroupq``).

``aiogroupq worker module:attr`` runs consumers until SIGTERM or SIGINT.
*attr* (dots allowed) names one of:

(a) a mapping of task type -> async handler; the worker builds
    ``aiogroupq.Consumer(redis_url, queue=--queue, handlers=attr,
    concurrency=--concurrency, lease_ttl=--lease-ttl,
    grace_period=--grace-period)``. ``--queue`` is required::

        # myapp/tasks.py
        async def import_rows(payload: ImportRequest) -> None: ...
        handlers = {"import_rows": import_rows}

        $ aiogroupq worker myapp.tasks:handlers --queue imports

(b) a factory for full control, called with keyword arguments as
    ``factory(*, redis_url, queue, concurrency)`` (``queue`` is ``None``
    without ``--queue``). It returns an un-entered ``aiogroupq.Consumer``, an
    awaitable of one, or an async context manager yielding an un-entered one
    (to open and close resources the handlers need around it); the worker
    enters the Consumer. Set ``lease_ttl`` and ``grace_period`` in the factory::

        def make_consumer(*, redis_url, queue, concurrency):
            return aiogroupq.Consumer(redis_url, queue=queue or "imports",
                                      handlers=handlers, concurrency=concurrency)

        $ aiogroupq worker myapp.tasks:make_consumer

The first SIGTERM or SIGINT stops claiming and gives running handlers the grace
period; a second one cancels them at once. Either way unfinished tasks go back
to the front of their groups. ``--processes N`` starts N worker processes,
forwards SIGTERM and SIGINT to them and waits; when one exits by itself the
others are stopped too. Exit status: 0 after a requested stop, 2 for a bad
command line or target, 1 when a worker failed.

``aiogroupq demo`` enqueues a mixed workload to a throwaway server (or
``--redis-url``), consumes it with several worker processes and checks from a
journal that every task ran exactly once, in order, one at a time per group.
"""

from __future__ import annotations

__all__ = ("main",)

import argparse
import importlib
import inspect
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import Any, Final

import anyio

from ._handlers import build_routes
from ._keys import validate_queue_name
from .consumer import Consumer
from .errors import ConfigurationError

logger = logging.getLogger("aiogroupq.cli")

DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
#: how often a supervised worker checks that its supervisor is still there
_PARENT_POLL: Final = 0.5

Target = Mapping[str, Any] | Callable[..., Any]


class UsageError(Exception):
    """A bad command line or target: reported in one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit status.

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else 2
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s [%(process)d] %(name)s: %(message)s",
    )
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(
                redis_url=args.redis_url,
                tasks=args.tasks,
                groups=args.groups,
                processes=args.processes,
                concurrency=args.concurrency,
                seed=args.seed,
            )
        return _worker(args)
    except UsageError as exc:
        if exc.__cause__ is not None:  # the user's module raised: show where
            traceback.print_exception(exc.__cause__)
        print(f"aiogroupq {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < 10**9:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds >= 0, got {text}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiogroupq",
        description="Asyncio task queue on Redis with group-serial execution.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    worker = commands.add_parser(
        "worker",
        help="run consumers until SIGTERM/SIGINT",
        description=__doc__.split("``aiogroupq demo``")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument(
        "target",
        metavar="module:attr",
        help="a mapping of task type -> async handler, or a Consumer factory",
    )
    worker.add_argument("--queue", help="queue name (required for a mapping)")
    worker.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        help="Redis URL (default: $REDIS_URL, else %(default)s)",
    )
    worker.add_argument(
        "--concurrency",
        type=_positive_int,
        default=64,
        help="handlers running at once per process (default: %(default)s)",
    )
    worker.add_argument(
        "--processes",
        type=_positive_int,
        default=1,
        help="worker processes (default: %(default)s)",
    )
    worker.add_argument(
        "--lease-ttl",
        type=_seconds,
        help="seconds a silent worker keeps its groups (mapping form; default 30)",
    )
    worker.add_argument(
        "--grace-period",
        type=_seconds,
        help="seconds running handlers get on stop (mapping form; default 30)",
    )
    worker.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # Set by --processes for its children: stop when the supervisor is gone.
    worker.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)

    demo = commands.add_parser(
        "demo",
        help="run a verified mixed workload on a throwaway server",
        description="Enqueue a mixed workload (a few hot groups, many small "
        "ones, ungrouped tasks), consume it with several worker processes and "
        "verify from a journal: every task ran exactly once, in enqueue order "
        "within its group, never two of a group at once.",
    )
    demo.add_argument(
        "--redis-url", help="use this server (default: start a throwaway one)"
    )
    demo.add_argument("--tasks", type=_positive_int, default=20_000)
    demo.add_argument("--groups", type=_positive_int, default=2_000)
    demo.add_argument("--processes", type=_positive_int, default=4)
    demo.add_argument("--concurrency", type=_positive_int, default=64)
    demo.add_argument("--seed", type=int, help="workload seed (default: random)")
    return parser


# -- loading the target ------------------------------------------------------


def load_target(spec: str) -> Target:
    """Import ``module:attr`` and check that it is a mapping or a factory.

    :param spec: ``package.module:attribute`` (the attribute may be dotted)
    :raises UsageError: if it cannot be imported or is neither
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise UsageError(
            f"expected module:attr (e.g. myapp.tasks:handlers), got {spec!r}"
        )
    # Like ``python -m``, so that the console script finds the user's modules.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise UsageError(f"cannot import module {module_name!r}: {exc}") from None
        raise UsageError(f"importing module {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise UsageError(f"importing module {module_name!r} failed: {exc!r}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(
                f"module {module_name!r} has no attribute {attr!r}"
            ) from None
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
    if callable(obj):
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
    raise UsageError(
        f"{spec} is a {type(obj).__name__}: expected a mapping of task type -> "
        "async handler, or a factory(*, redis_url, queue, concurrency) returning "
        "an aiogroupq.Consumer"
    )


def _check_options(spec: str, target: Target, args: argparse.Namespace) -> None:
    if args.queue is not None:
        try:
            validate_queue_name(args.queue)
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
    if isinstance(target, Mapping):
        if args.queue is None:
            raise UsageError(f"--queue is required: {spec} is a mapping of handlers")
    elif args.lease_ttl is not None or args.grace_period is not None:
        raise UsageError(
            f"--lease-ttl and --grace-period apply to a mapping of handlers; "
            f"{spec} is a factory: set them in the Consumer it creates"
        )


@asynccontextmanager
async def _open_consumer(
    spec: str, target: Target, args: argparse.Namespace
) -> AsyncIterator[Consumer]:
    if isinstance(target, Mapping):
        options: dict[str, Any] = {}
        if args.lease_ttl is not None:
            options["lease_ttl"] = args.lease_ttl
        if args.grace_period is not None:
            options["grace_period"] = args.grace_period
        try:
            consumer = Consumer(
                args.redis_url,
                queue=args.queue,
                handlers=target,
                concurrency=args.concurrency,
                **options,
            )
        except ConfigurationError as exc:
            raise UsageError(str(exc)) from None
        async with consumer:
            yield consumer
        return
    try:
        made = target(
            redis_url=args.redis_url, queue=args.queue, concurrency=args.concurrency
        )
        if inspect.isawaitable(made):
            made = await made
    except ConfigurationError as exc:
        raise UsageError(f"{spec}: {exc}") from None
    if isinstance(made, Consumer):
        async with made:
            yield made
    elif isinstance(made, AbstractAsyncContextManager):
        async with made as consumer:
            if not isinstance(consumer, Consumer):
                raise UsageError(
                    f"{spec} yielded {consumer!r}, not an aiogroupq.Consumer"
                )
            async with consumer:
                yield consumer
    else:
        raise UsageError(f"{spec} returned {made!r}, not an aiogroupq.Consumer")


# -- one worker process --------------------------------------------------------


def _worker(args: argparse.Namespace) -> int:
    target = load_target(args.target)
    _check_options(args.target, target, args)
    if args.processes > 1:
        return _supervise(args)
    try:
        anyio.run(_serve, args.target, target, args)
    except BaseException as exc:
        inner = _sole(exc)
        if isinstance(inner, UsageError):
            raise inner from inner.__cause__
        if isinstance(inner, KeyboardInterrupt):
            return 130
        logger.critical("worker failed", exc_info=inner)
        return 1
    return 0


def _sole(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


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
                with run_scope:
                    async with _open_consumer(spec, target, args) as consumer:
                        logger.info(
                            "worker ready: %s on queue %r (send SIGTERM or SIGINT "
                            "to stop)",
                            spec,
                            consumer.queue,
                        )
                        await stop.wait()
            finally:
                tg.cancel_scope.cancel()


async def _watch_signals(
    signals: AsyncIterator[signal.Signals],
    stop: anyio.Event,
    run_scope: anyio.CancelScope,
) -> None:
    async for signum in signals:
        if not stop.is_set():
            logger.info(
                "%s: finishing running tasks (send it again to stop at once)",
                signum.name,
            )
            stop.set()
        else:
            logger.warning("%s again: cancelling running tasks", signum.name)
            run_scope.cancel()


async def _watch_parent(parent_pid: int, stop: anyio.Event) -> None:
    while True:
        await anyio.sleep(_PARENT_POLL)
        if os.getppid() != parent_pid:
            break
    logger.warning("the supervising process %d is gone: stopping", parent_pid)
    stop.set()


# -- several worker processes --------------------------------------------------


def _child_argv(args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "aiogroupq", "worker", args.target]
    argv += ["--processes", "1", "--parent-pid", str(os.getpid())]
    argv += ["--redis-url", args.redis_url, "--concurrency", str(args.concurrency)]
    for flag, value in (
        ("--queue", args.queue),
        ("--lease-ttl", args.lease_ttl),
        ("--grace-period", args.grace_period),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.verbose:
        argv.append("-v")
    return argv


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def _supervise(args: argparse.Namespace) -> int:
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop_children(signum: int) -> None:
        for child in children:
            if child.poll() is None:
                with suppress(ProcessLookupError):
                    child.send_signal(signum)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        stop_children(signum)

    previous = {signum: signal.signal(signum, on_signal) for signum in _STOP_SIGNALS}
    failed = 0
    try:
        argv = _child_argv(args)
        for _ in range(args.processes):
            if stopping:
                break
            # Own process group: a terminal's Ctrl-C reaches only us, and we
            # forward it once (twice would cut the grace period short).
            children.append(subprocess.Popen(argv, process_group=0))
        logger.info("started %d worker processes", len(children))
        while any(child.poll() is None for child in children):
            ended = [c for c in children if c.returncode is not None]
            if not stopping and ended:
                code = ended[0].returncode
                logger.error(
                    "worker process %d exited with status %d: stopping the others",
                    ended[0].pid,
                    _exit_status(code),
                )
                stopping = True
                stop_children(signal.SIGTERM)
            if (
                not stopping
                and args.parent_pid is not None
                and os.getppid() != args.parent_pid
            ):
                logger.warning("the supervising process is gone: stopping")
                stopping = True
                stop_children(signal.SIGTERM)
            time.sleep(0.1)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for child in children:
            if child.poll() is None:  # we are failing ourselves: leave no orphans
                child.kill()
                child.wait()
    for child in children:
        if child.returncode != 0:
            failed = failed or _exit_status(child.returncode)
            logger.error(
                "worker process %d exited with status %d",
                child.pid,
                _exit_status(child.returncode),
            )
    return failed
