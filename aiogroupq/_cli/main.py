"""The ``aiogroupq`` command line (also ``python -m aiogroupq``).

``aiogroupq worker module:attr`` consumes until SIGTERM or SIGINT. *attr*
(dots allowed) names either:

(a) a mapping of task type -> async handler. The worker runs
    ``Consumer(--redis-url, queue=--queue, handlers=attr, concurrency=...,
    lease_ttl=..., grace_period=..., name=...)``; ``--queue`` is required.
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

A first SIGTERM or SIGINT stops claiming and lets running handlers finish
within the grace period; a second one cancels them. Unfinished tasks are
handed back to the front of their groups. ``--processes N`` runs N worker
processes, forwards SIGTERM and SIGINT to them and waits; when one ends by
itself the others are stopped. Exit status: 0 after a requested stop, 2 for a
bad command line, target or configuration, 1 when a worker failed.

``aiogroupq demo`` runs a mixed workload with several worker processes on a
throwaway server (or ``--redis-url``) and verifies it from a journal.

The operator commands (``stats``, ``groups``, ``group``, ``task``,
``consumers``, ``dead``, ``release``, ``pause``, ``resume``, ``cancel``) are
in ``_cli/ops.py``; ``aiogroupq dashboard`` (the web dashboard) is in
``_cli/dashboard.py``.
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
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from typing import TYPE_CHECKING, Any, Final

import anyio
from redis.exceptions import RedisError

from .. import __version__
from .._inspect.check import DEFAULT_MAX_PAYLOAD, examine_partitions
from .._inspect.repair import repair_partitions
from .._store.connection import safe_url
from .._store.keys import QueueKeys, validate_queue_name
from .._telemetry.log import configure as configure_logging
from .._work.handlers import build_routes
from .._work.schedule import Schedule
from ..consumer import Consumer
from ..errors import ConfigurationError, MissingExtraError, RedisUnavailableError
from . import dashboard as _cli_dashboard, ops as _cli_ops

if TYPE_CHECKING:
    from .._telemetry.events import Observer

logger: logging.Logger = logging.getLogger("aiogroupq.cli")

DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"
_STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
#: how often a supervised worker checks that its supervisor is still there
_PARENT_POLL: Final = 0.5
#: how a worker we stopped may end: one stopped before it installed its
#: signal handlers dies of the signal, which is still a clean stop
_STOPPED: Final = frozenset({0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGINT})
#: seconds between attempts to start while Redis is unreachable: the first
#: wait, then doubling up to the last
_RETRY_FIRST, _RETRY_MAX = 0.5, 30.0

Target = Mapping[str, Any] | Callable[..., Any]


class UsageError(Exception):
    """A bad command line or target: reported in one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit status.

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    try:
        args = _parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else 2
    configure_logging(
        verbose=getattr(args, "verbose", False),
        log_format=getattr(args, "log_format", "text"),
    )
    if args.command in _cli_ops.COMMANDS:
        return _cli_ops.run(args)
    if args.command == "dashboard":
        return _cli_dashboard.run(args)
    try:
        if args.command == "worker":
            return _worker(args)
        if args.command == "check":
            return anyio.run(
                _check, args.redis_url, args.queue, args.repair, args.max_payload_bytes
            )
        from .demo import run_demo

        return run_demo(
            redis_url=args.redis_url,
            tasks=args.tasks,
            groups=args.groups,
            processes=args.processes,
            concurrency=args.concurrency,
            seed=args.seed,
        )
    except UsageError as exc:
        if exc.__cause__ is not None:  # the user's module raised: show where
            traceback.print_exception(exc.__cause__)
        print(f"aiogroupq {args.command}: error: {exc}", file=sys.stderr)
        return 2


async def _check(redis_url: str, queue: str, repair: bool, max_payload: int) -> int:
    try:
        QueueKeys(queue)  # a bad name is refused before connecting
        snaps, problems = await examine_partitions(
            redis_url, queue, max_payload=max_payload
        )
        if all(snap.empty for snap in snaps):
            # Most likely a misspelt name or another database: "0 problems"
            # would read as a clean bill of health.
            print(f"queue {queue!r} has no keys (check the name and the database)")
            return 0
        for problem in problems:
            print(problem)
        print(f"queue {queue!r}: {len(problems)} problems")
        if not repair or not problems:
            return 1 if problems else 0
        done, problems = await repair_partitions(
            redis_url, queue, max_payload=max_payload
        )
    except (ConfigurationError, RedisUnavailableError) as exc:
        raise UsageError(f"Redis at {safe_url(redis_url)}: {exc}") from None
    for change in done:
        print(f"repaired: {change}")
    for problem in problems:
        print(f"left: {problem}")
    print(f"queue {queue!r}: {len(done)} changes made, {len(problems)} problems left")
    return 1 if problems else 0


def _plain(text: str) -> str:
    """A docstring as help text: without its reST literal markup."""
    return text.replace("``", "")


def _positive_int(text: str) -> int:
    if (value := int(text)) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    if not 0 < (value := int(text)) < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port, got {value}")
    return value


def _seconds(text: str) -> float:
    if not 0 <= (value := float(text)) < 10**9:
        raise argparse.ArgumentTypeError(f"must be seconds >= 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aiogroupq",
        description="Asyncio task queue on Redis with group-serial execution.",
    )
    parser.add_argument(
        "--version", action="version", version=f"aiogroupq {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    worker = commands.add_parser(
        "worker",
        help="run consumers until SIGTERM/SIGINT",
        description=_plain(__doc__.split("``aiogroupq demo``")[0]),
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
    check = commands.add_parser(
        "check",
        help="check a queue's Redis keys for broken invariants (exit 1 if any)",
        description="Walk every key of a queue and report each broken invariant "
        "(a task in two places or in none, a slot mark without its task, a "
        "group's line behind a free slot, a key of the wrong type, an envelope "
        "that does not decode, ...). The reads are not one snapshot: on a busy "
        "queue, run it twice before you believe a problem. With --repair, "
        "repair what it found, keeping group order, then report what is left "
        "(exit 1 if anything is).",
    )
    check.add_argument("--queue", required=True, help="queue name")
    check.add_argument(
        "--repair",
        action="store_true",
        help="repair the problems found (safe on a live queue)",
    )
    check.add_argument(
        "--max-payload-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_PAYLOAD,
        help="the consumers' max_payload_bytes: live tasks over it are "
        "reported (default %(default)s)",
    )
    check.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        help="Redis URL (default: $REDIS_URL, else %(default)s)",
    )
    demo = commands.add_parser(
        "demo",
        help="run a verified mixed workload on a throwaway server",
        description="Enqueue a mixed workload (a few hot groups, many small "
        "ones, ungrouped tasks), consume it with several worker processes and "
        "verify from a journal: every task ran exactly once, in enqueue order "
        "within its group, never two of a group at once.",
    )
    demo.add_argument("--redis-url", help="a server to use (default: a throwaway one)")
    _cli_ops.add_commands(commands, DEFAULT_REDIS_URL)
    _cli_dashboard.add_command(commands, DEFAULT_REDIS_URL)
    for command, flag, kind, default, text in (
        (worker, "--concurrency", _positive_int, 64, "handlers at once per process"),
        (worker, "--processes", _positive_int, 1, "worker processes"),
        (worker, "--lease-ttl", _seconds, None, "seconds (mapping form; default 30)"),
        (worker, "--grace-period", _seconds, None, "seconds (mapping form; default 30)"),
        (demo, "--tasks", _positive_int, 20_000, "tasks to enqueue"),
        (demo, "--groups", _positive_int, 2_000, "groups they belong to"),
        (demo, "--processes", _positive_int, 4, "worker processes"),
        (demo, "--concurrency", _positive_int, 64, "handlers at once per process"),
        (demo, "--seed", int, None, "workload seed (default: random)"),
    ):  # fmt: skip
        suffix = "" if default is None else " (default: %(default)s)"
        command.add_argument(flag, type=kind, default=default, help=text + suffix)
    worker.add_argument(
        "--name",
        help="consumer name (mapping form; with --processes N, NAME-1..NAME-N): "
        "a worker restarted with its name resumes its unfinished tasks at once",
    )
    worker.add_argument(
        "--allow-eviction",
        action="store_true",
        help="(mapping form) run even if Redis's maxmemory-policy may evict "
        "keys, which can lose tasks; by default the worker refuses to start",
    )
    worker.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="debug logging of aiogroupq (one line per task)",
    )
    worker.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines as text or as JSON objects (default: %(default)s)",
    )
    worker.add_argument(
        "--metrics-port",
        type=_port,
        help="serve Prometheus metrics on this port (needs aiogroupq[prometheus]; "
        "with --processes N, the workers use PORT..PORT+N-1)",
    )
    # Set by --processes for its children: stop when the supervisor is gone.
    worker.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
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


def _check_options(spec: str, target: Target, args: argparse.Namespace) -> None:
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


def _worker(args: argparse.Namespace) -> int:
    target = load_target(args.target)
    _check_options(args.target, target, args)
    if args.processes > 1:
        return _supervise(args)
    try:
        anyio.run(_serve, args.target, target, args)
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
        else:
            logger.critical("worker failed", exc_info=exc)
        return 1
    return 0


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
    """With --metrics-port: keep the queue's counts as gauges, from one
    ``Admin.stats()`` call every few seconds (each counts every consumer's
    tasks, so any one worker's metrics show the whole queue)."""
    from ..admin import Admin
    from ..prometheus import PrometheusObserver

    assert isinstance(observer, PrometheusObserver)
    async with Admin(args.redis_url, queue=args.queue) as admin:

        async def read() -> dict[str, int]:
            stats = await admin.stats()
            return {
                "ready": stats.ready,
                "parked": stats.parked,
                "held": stats.held,
                "delayed": stats.delayed,
                "running": stats.running,
                "dead": stats.dead,
            }

        await observer.watch_queue(args.queue, read)


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
                logger.info("worker ready: %s on queue %r", spec, consumer.queue)
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
    """With --metrics-port: serve Prometheus metrics while the worker runs."""
    if args.metrics_port is None:
        yield ()
        return
    try:
        from ..prometheus import PrometheusObserver, serve
    except MissingExtraError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None
    try:
        server = serve(args.metrics_port)
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
