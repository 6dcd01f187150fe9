"""The ``aiogroupq`` command line's arguments: the parser of every command
(the operator commands, ``dashboard`` and ``server`` add their own, from
``_cli/ops_args.py``, ``_cli/dashboard.py`` and ``_cli/server.py``) and the
types of its values."""

from __future__ import annotations

__all__ = ("DEFAULT_REDIS_URL", "parse", "parser")

import argparse
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from .. import __version__
from .._limits import DEFAULT_MAX_PAYLOAD_BYTES
from . import (
    dashboard as _cli_dashboard,
    ops_args as _cli_ops_args,
    server as _cli_server,
    worker as _cli_worker,
)
from .ops_args import QUEUE_ENV

DEFAULT_REDIS_URL: Final = "redis://localhost:6379/0"

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def parser() -> argparse.ArgumentParser:
    """The parser of the whole command line."""
    top = argparse.ArgumentParser(
        prog="aiogroupq",
        description="Asyncio task queue on Redis with group-serial execution.",
    )
    top.add_argument("--version", action="version", version=f"aiogroupq {__version__}")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_worker(commands)
    _add_check(commands)
    _add_demo(commands)
    _cli_ops_args.add_commands(commands, DEFAULT_REDIS_URL)
    _cli_dashboard.add_command(commands, DEFAULT_REDIS_URL)
    _cli_server.add_command(commands)
    return top


#: the commands that print JSON with ``--json``
_JSON_COMMANDS: Final = "stats, groups, group, task, consumers, dead list and dead show"


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, parsed.

    An argument that the command does not take is reported with that
    command's usage (argparse's own would print the top-level one, which
    does not say which command refused what).

    :param argv: the arguments (default: ``sys.argv[1:]``)
    :raises SystemExit: after ``--help`` or ``--version``, or a usage error
    """
    top = parser()
    args, extra = top.parse_known_args(argv)
    if extra:
        hint = f" (--json is for {_JSON_COMMANDS})" if "--json" in extra else ""
        _command_parser(top, args).error(
            f"unrecognized arguments: {' '.join(extra)}{hint}"
        )
    return args


def _command_parser(
    top: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The parser of the (sub)command that *args* ran: ``dead requeue``'s,
    not ``dead``'s."""
    found = top
    for dest in ("command", "action"):  # "action": the subcommand of dead
        chosen = getattr(args, dest, None)
        subcommands = [
            a for a in found._actions if isinstance(a, argparse._SubParsersAction)
        ]
        if chosen is None or not subcommands:
            break
        found = subcommands[0].choices[chosen]
    return found


def _redis_url(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        help="Redis URL (default: $REDIS_URL, else %(default)s)",
    )


def _add_worker(commands: Commands) -> None:
    worker = commands.add_parser(
        "worker",
        help="run consumers until SIGTERM/SIGINT",
        description=_plain(_cli_worker.__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument(
        "target",
        metavar="module:attr",
        help="a mapping of task type -> async handler, or a Consumer factory",
    )
    worker.add_argument("--queue", help="queue name (required for a mapping)")
    _redis_url(worker)
    for flag, kind, default, text in (
        ("--concurrency", _positive_int, 64, "handlers at once per process"),
        ("--processes", _positive_int, 1, "worker processes"),
        ("--lease-ttl", _seconds, None, "seconds (mapping form; default 30)"),
        ("--grace-period", _seconds, None, "seconds (mapping form; default 30)"),
        ("--partition-replicas", _positive_int, None,
         "consumers per partition (mapping form; default 2)"),
    ):  # fmt: skip
        suffix = "" if default is None else " (default: %(default)s)"
        worker.add_argument(flag, type=kind, default=default, help=text + suffix)
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
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="the event loop: uvloop (pip install 'aiogroupq[uvloop]'), "
        "asyncio's own, or auto: uvloop where installed (default: %(default)s)",
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
    worker.add_argument(
        "--metrics-created",
        action="store_true",
        help="with --metrics-port, also serve the *_created series of counters "
        "and histograms (left out by default)",
    )
    # Set by --processes for its children: stop when the supervisor is gone.
    worker.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)


def _add_check(commands: Commands) -> None:
    check = commands.add_parser(
        "check",
        help="check a queue's Redis keys for broken invariants (exit 1 if any)",
        description="Walk every key of a queue and report each broken invariant "
        "(a task in two places or in none, a slot mark without its task, a "
        "group's line behind a free slot, a key of the wrong type, an envelope "
        "that does not decode, ...). The reads are not one snapshot: each "
        "problem found is read again, its keys together, and reported only if "
        "it is still there, so a busy queue checks clean. With --repair, "
        "repair what it found, keeping group order, then report what is left "
        "(exit 1 if anything is).",
    )
    queue = os.environ.get(QUEUE_ENV)
    check.add_argument(
        "--queue",
        default=queue,
        required=queue is None,
        help=f"queue name (default: ${QUEUE_ENV})",
    )
    check.add_argument(
        "--repair",
        action="store_true",
        help="repair the problems found (safe on a live queue)",
    )
    check.add_argument(
        "--max-payload-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        help="the consumers' max_payload_bytes: live tasks over it are "
        "reported (default %(default)s)",
    )
    _redis_url(check)


def _add_demo(commands: Commands) -> None:
    demo = commands.add_parser(
        "demo",
        help="run a verified mixed workload on a throwaway server",
        description="Enqueue a mixed workload (a few hot groups, many small "
        "ones, ungrouped tasks), consume it with several worker processes and "
        "verify from a journal: every task ran exactly once, in enqueue order "
        "within its group, never two of a group at once.",
    )
    demo.add_argument("--redis-url", help="a server to use (default: a throwaway one)")
    for flag, kind, default, text in (
        ("--tasks", _positive_int, 20_000, "tasks to enqueue"),
        ("--groups", _positive_int, 2_000, "groups they belong to"),
        ("--processes", _positive_int, 4, "worker processes"),
        ("--concurrency", _positive_int, 64, "handlers at once per process"),
        ("--seed", int, None, "workload seed (default: random)"),
    ):  # fmt: skip
        suffix = "" if default is None else " (default: %(default)s)"
        demo.add_argument(flag, type=kind, default=default, help=text + suffix)


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
