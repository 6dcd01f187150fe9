"""``aiogroupq dashboard``: serve the web dashboard with uvicorn.

The parser needs nothing beyond the core; running it imports the
``dashboard`` extra (Starlette, Jinja2, uvicorn) and says how to install it
when it is missing.
"""

from __future__ import annotations

__all__ = ("add_command", "run")

import argparse
import ipaddress
import os
import sys
from typing import TYPE_CHECKING, Final

import anyio

from .._dashboard._hosts import LOOPBACK
from .._store.connection import CALL_BUDGET, open_client, safe_url
from .._store.failures import unavailable_as_error
from .._store.keys import validate_queue_name
from ..errors import ConfigurationError, MissingExtraError, RedisUnavailableError

if TYPE_CHECKING:
    from starlette.applications import Starlette

_QUEUE_ENV: Final = "AIOGROUPQ_QUEUE"
#: the names of the loopback, allowed as Host when it listens there


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], redis_url: str
) -> None:
    """Add ``dashboard`` to the ``aiogroupq`` parser.

    :param commands: the parser's subcommands
    :param redis_url: the default ``--redis-url``
    """
    parser = commands.add_parser(
        "dashboard",
        help="serve the web dashboard (needs aiogroupq[dashboard])",
        description="Serve the web dashboard of one or more queues: counts, "
        "throughput and failure rate, groups and why they wait, tasks, dead "
        "letters, consumers, refreshed live. Without --token-env it is "
        "read-only: with it, the page asks for the token and a signed-in "
        "operator may pause and resume, release, requeue, purge and cancel.",
    )
    parser.add_argument(
        "--queue",
        action="append",
        metavar="QUEUE",
        help=f"a queue to show; repeat for more (default: ${_QUEUE_ENV})",
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", redis_url),
        help="Redis URL (default: $REDIS_URL, else %(default)s)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s)",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=8000,
        help="port to listen on (default: %(default)s)",
    )
    parser.add_argument(
        "--token-env",
        metavar="VAR",
        help="the environment variable holding the operators' token (at least "
        "16 characters); without it the dashboard is read-only",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="refuse every action, even with a token",
    )
    parser.add_argument(
        "--show-payloads",
        action="store_true",
        help="show task payloads and results (hidden by default), and with "
        "them error messages and tracebacks",
    )
    parser.add_argument(
        "--show-errors",
        action="store_true",
        help="show error messages, dead-letter reasons and tracebacks, which "
        "may quote a payload (hidden by default, unless --show-payloads)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a Host name browsers reach the dashboard by (name, name:port or "
        "*.domain); repeat for more. The --host it listens on is allowed, and "
        "localhost, 127.0.0.1 and ::1 when that is the loopback or every "
        "address; any other Host is refused with 400 (DNS rebinding)",
    )
    parser.add_argument(
        "--history",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="seconds of throughput history charted (default: %(default)g)",
    )
    parser.add_argument(
        "--root-path",
        default="",
        help="the path prefix a reverse proxy serves it under (e.g. /dashboard)",
    )


def _port(text: str) -> int:
    if not 0 < (value := int(text)) < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; return the exit status (2 for a bad
    command line, a missing extra, or a ``--redis-url`` that reaches no
    Redis server it may use)."""
    try:
        app = _build(args)
        import uvicorn

        _probe(args.redis_url)
    except (ConfigurationError, MissingExtraError) as exc:
        print(f"aiogroupq dashboard: error: {exc}", file=sys.stderr)
        return 2
    except ImportError as exc:  # uvicorn alone missing
        error = MissingExtraError(
            "aiogroupq dashboard", "dashboard", exc.name or "uvicorn"
        )
        print(f"aiogroupq dashboard: error: {error}", file=sys.stderr)
        return 2
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        root_path=args.root_path,
        log_level="info",
        # The pages are ours: no "Server: uvicorn" banner is needed.
        server_header=False,
    )
    server = uvicorn.Server(config)
    hosts = ", ".join(allowed_hosts(args.host, args.allowed_host or []))
    print(
        f"aiogroupq dashboard of {', '.join(map(repr, args.queue))} on "
        f"http://{args.host}:{args.port}{args.root_path}/ "
        f"({'token login' if args.token_env else 'read-only: no --token-env'}); "
        f"it answers to Host {hosts} (more with --allowed-host)",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    # uvicorn returns when it could not bind, as well as after a signal.
    return 0 if server.started else 1


def _probe(url: str) -> None:
    """Connect once before serving: a URL that no wait will mend (another
    protocol on the port, refused credentials, a cluster node without
    ``redis+cluster://``) is refused as every command refuses it. A Redis
    that is down is only said: the pages say so until it is back.

    :raises ConfigurationError: for such a URL
    """
    try:
        anyio.run(_ping, url)
    except RedisUnavailableError as exc:
        print(
            f"aiogroupq dashboard: warning: Redis at {safe_url(url)} does not "
            f"answer now ({exc.detail}); the pages say so until it does",
            file=sys.stderr,
            flush=True,
        )


@unavailable_as_error
async def _ping(url: str) -> None:
    # One try: the server answers, refuses, or is down; a frozen one is
    # given up on as a call of ours would.
    async with open_client(url, retry=False) as client:
        with anyio.move_on_after(CALL_BUDGET) as scope:
            await client.ping()
    if scope.cancelled_caught:
        raise RedisUnavailableError(f"no reply within {CALL_BUDGET:.1f} s")


def _build(args: argparse.Namespace) -> Starlette:
    queues = args.queue or (
        [os.environ[_QUEUE_ENV]] if os.environ.get(_QUEUE_ENV) else []
    )
    if not queues:
        raise ConfigurationError(f"--queue is required (or set ${_QUEUE_ENV})")
    for queue in queues:
        validate_queue_name(queue)
    args.queue = queues
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise ConfigurationError(
                f"--token-env {args.token_env}: the environment variable is not "
                "set or is empty"
            )
    from ..dashboard import create_app

    return create_app(
        args.redis_url,
        queues=queues,
        token=token,
        read_only=args.read_only,
        show_payloads=args.show_payloads,
        show_errors=args.show_errors or args.show_payloads,
        allowed_hosts=allowed_hosts(args.host, args.allowed_host or []),
        history=args.history,
    )


def allowed_hosts(bound: str, given: list[str]) -> list[str]:
    """The Host names the dashboard answers to: the address it listens on
    (unless that is every address), the loopback's names when it listens
    there, and *given*."""
    try:
        address = ipaddress.ip_address(bound.strip("[]"))
    except ValueError:  # a name
        loopback, everywhere = bound.lower() == "localhost", False
    else:
        loopback, everywhere = address.is_loopback, address.is_unspecified
    hosts = [] if everywhere or not bound else [bound]
    if loopback or everywhere or not bound:
        hosts += [h for h in LOOPBACK if h not in hosts]
    return hosts + [h for h in given if h not in hosts]
