"""The ``aiogroupq`` command line (also ``python -m aiogroupq``).

:func:`main` parses the arguments (``_cli/args.py``) and runs the command:

- ``aiogroupq worker module:attr`` consumes until SIGTERM or SIGINT
  (``_cli/worker.py``; the target it runs is loaded by ``_cli/target.py``).
- ``aiogroupq check`` checks a queue's keys, and repairs them with
  ``--repair`` (here).
- ``aiogroupq demo`` runs a mixed workload with several worker processes on
  a throwaway server (or ``--redis-url``) and verifies it from a journal
  (``_cli/demo.py``).
- The operator commands (``stats``, ``groups``, ``group``, ``task``,
  ``consumers``, ``dead``, ``release``, ``pause``, ``resume``, ``cancel``,
  ``repartition``) are in ``_cli/ops.py``; ``aiogroupq dashboard`` (the web
  dashboard) is in ``_cli/dashboard.py``.
- ``aiogroupq server`` runs a throwaway Redis-protocol server for local
  development (``_cli/server.py``).

Whatever the command, an error of aiogroupq's is one line on stderr and
exit status 2, and a reader that stops reading the output (``| head``) ends
the command quietly (``_cli/stdout.py``).
"""

from __future__ import annotations

__all__ = ("main",)

import functools
import sys
import traceback

import anyio

from .._check.check import examine
from .._check.repair import repair_partitions
from .._inspect.printable import json_printable, printable
from .._store.connection import open_client, safe_url
from .._store.keys import QueueKeys
from .._store.restart_risk import restart_risk
from .._telemetry.log import LogFormat, configure as configure_logging
from ..errors import AiogroupqError, ConfigurationError, RedisUnavailableError
from . import (
    dashboard as _cli_dashboard,
    ops as _cli_ops,
    server as _cli_server,
    worker as _cli_worker,
)
from .args import parse
from .near import did_you_mean
from .stdout import StdoutClosed, closed_stdout, complain, say
from .target import UsageError


def main(argv: list[str] | None = None) -> int:
    """Run the command line and return the exit status.

    :param argv: the arguments (default: ``sys.argv[1:]``)
    """
    try:
        status = _run(argv)
        # Short output is still in the buffer: a gone reader shows here.
        sys.stdout.flush()
    except (StdoutClosed, BrokenPipeError):
        return closed_stdout()
    return status


def _run(argv: list[str] | None) -> int:
    try:
        args = parse(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # --help, or argparse's own usage error
        return exc.code if isinstance(exc.code, int) else 2
    log_format: LogFormat = getattr(args, "log_format", "text")
    configure_logging(
        verbose=getattr(args, "verbose", False),
        log_format=log_format,
        # A traceback keeps its lines; JSON its own escapes, as JSON.
        escape=(
            json_printable
            if log_format == "json"
            else functools.partial(printable, keep="\n")
        ),
    )
    try:
        if args.command in _cli_ops.COMMANDS:
            return _cli_ops.run(args)
        if args.command == "dashboard":
            return _cli_dashboard.run(args)
        if args.command == "server":
            return _cli_server.run(args)
        if args.command == "worker":
            return _cli_worker.run(args)
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
        complain(f"aiogroupq {args.command}: error: {exc}")
        return 2
    except AiogroupqError as exc:  # e.g. the demo's server did not start
        # Each command reports its own errors; one that escapes is still
        # one line, never a traceback.
        complain(f"aiogroupq {args.command}: error: {exc}")
        return 2


async def _check(redis_url: str, queue: str, repair: bool, max_payload: int) -> int:
    try:
        QueueKeys(queue)  # a bad name is refused before connecting
        found = await examine(redis_url, queue, max_payload=max_payload)
        async with open_client(redis_url, retry=True) as client:
            # Advisory: said, but not a problem of the queue's keys.
            if (risk := await restart_risk(client)) is not None:
                say(f"warning: {risk}")
        if found.empty:
            # Most likely a misspelt name or another database: "0 problems"
            # would read as a clean bill of health.
            hint = await did_you_mean(redis_url, queue)
            say(f"queue {queue!r} has no keys (check the name and the database){hint}")
            return 0
        for problem in found.problems:
            say(problem)
        for problem in found.unsure:
            say(f"unsure: {problem}")
        if found.unsure:
            say(
                f"queue {queue!r}: {len(found.unsure)} counts of the whole queue "
                "differ from what was counted while the queue moved; not "
                "problems unless a check of the queue at rest (paused, or "
                "between bursts) reports them"
            )
        say(f"queue {queue!r}: {len(found.problems)} problems")
        if not repair or not found.problems:
            return 1 if found.problems else 0
        done, problems = await repair_partitions(
            redis_url, queue, max_payload=max_payload
        )
    except (ConfigurationError, RedisUnavailableError) as exc:
        raise UsageError(f"Redis at {safe_url(redis_url)}: {exc}") from None
    for change in done:
        say(f"repaired: {change}")
    for problem in problems:
        say(f"left: {problem}")
    say(f"queue {queue!r}: {len(done)} changes made, {len(problems)} problems left")
    return 1 if problems else 0
