"""A throwaway Redis Sentinel deployment on loopback ports: a primary, its
replicas and the sentinels that watch them, each a
:class:`~aiogroupq.testing._server.ServerProcess` (a sentinel is the server
binary run with ``--sentinel`` on a configuration file of its own, which it
rewrites as it learns)::

    with SentinelSet(replicas=1, sentinels=3) as deployment:
        print(deployment.url)  # redis+sentinel://127.0.0.1:<port>,.../mymaster/0
        old = deployment.primary()
        deployment.kill(old)  # kill -9
        new = deployment.wait_promoted(old)

``down-after-milliseconds`` is 1 s and ``failover-timeout`` 3 s by default,
so a failover takes a few seconds. Both Redis (``redis-server``) and Valkey
(``valkey-server``) run as sentinels.
"""

from __future__ import annotations

__all__ = ("SentinelSet",)

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ._server import (
    ServerProcess,
    ServerStartError,
    Started,
    _dying_with_us,
    find_server_binary,
)

#: seconds the sentinels may take to find each other and the replicas
SETTLE_TIMEOUT: Final = 30.0
#: the service name the sentinels monitor the primary under
SERVICE: Final = "mymaster"


class _SentinelProcess(ServerProcess):
    """A sentinel: the server binary on a configuration file that it may
    rewrite (written once, at its first start, from *monitor*)."""

    def __init__(self, *, binary: str, workdir: Path, lines: Sequence[str]) -> None:
        super().__init__(binary=binary, workdir=workdir)
        self._lines = list(lines)

    @property
    def conf(self) -> Path:
        """The sentinel's configuration file."""
        return self.workdir / "sentinel.conf"

    def _try_start(self, binary: str) -> bool:
        if not self.conf.exists() or not self._fixed_port:
            text = [f"port {self.port}", "bind 127.0.0.1", f"dir {self.workdir}"]
            self.conf.write_text("\n".join([*text, *self._lines]) + "\n")
        argv = [binary, str(self.conf), "--sentinel"]
        if self.die_with_parent:
            argv = _dying_with_us(argv)
        with open(self.workdir / "server.log", "ab") as log:
            try:
                self.process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    process_group=0,
                )
            except OSError as exc:
                raise ServerStartError(binary, f"cannot run it: {exc}") from exc
        deadline = time.monotonic() + self.start_timeout
        with _client(self.port) as probe:
            while True:
                try:
                    probe.ping()
                    return True
                except (redis.ConnectionError, redis.TimeoutError):
                    if self.process.poll() is not None:
                        self.process = None
                        return False
                    if time.monotonic() > deadline:
                        self.kill()
                        raise ServerStartError(
                            binary,
                            f"the sentinel did not answer PING within "
                            f"{self.start_timeout}s: {self.log_tail() or 'no output'}",
                        ) from None
                    time.sleep(0.02)


def _client(port: int) -> redis.Redis:
    """A plain synchronous client of one process, one try per command."""
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_timeout=5.0,
        socket_connect_timeout=5.0,
        retry=Retry(NoBackoff(), 0),
    )


class SentinelSet(Started):
    """A primary with *replicas* replicas, watched by *sentinels* sentinels.

    :param replicas: replicas of the primary (one at least, or no failover)
    :param sentinels: sentinels (three make a majority of two survive one)
    :param quorum: sentinels that must agree the primary is down
        (default: a majority)
    :param down_after_ms: ``down-after-milliseconds``: silence after which
        a sentinel holds the primary down
    :param failover_timeout_ms: ``failover-timeout``
    :param config: more configuration for the data nodes (as for
        :class:`ServerProcess`), e.g. ``{"appendonly": "yes"}``
    :param workdir: where the processes' directories go (default: a
        temporary directory, removed by :meth:`close`)
    :param binary: the server binary (default: :func:`find_server_binary`)
    """

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        config: Mapping[str, str | int | Sequence[str]] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
    ) -> None:
        if replicas < 1 or sentinels < 1:
            raise ValueError(f"bad shape: {replicas} replicas, {sentinels} sentinels")
        self.replicas = replicas
        self.sentinel_count = sentinels
        self.quorum = quorum or sentinels // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.service = SERVICE
        self._binary = binary
        self._config: dict[str, Any] = {
            # A replica syncs at once (Redis 7 waits 5 s for others to join
            # a diskless sync by default).
            "repl-diskless-sync-delay": 0,
            **(config or {}),
        }
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._dir = None if workdir is None else Path(workdir)
        #: the data nodes, the first primary first
        self.nodes: list[ServerProcess] = []
        self.sentinels: list[ServerProcess] = []

    # -- where -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+sentinel://`` with every sentinel, the service, db 0."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def client(self, node: ServerProcess) -> redis.Redis:
        """A plain synchronous client of one process (close it after use)."""
        return _client(node.port)

    def primary(self) -> ServerProcess:
        """The data node the sentinels agree is the primary, running and
        saying so itself.

        :raises LookupError: if they do not agree now
        """
        answers = set()
        for sentinel in self.sentinels:
            if not sentinel.running():
                continue
            try:
                with self.client(sentinel) as c:
                    state = c.execute_command("SENTINEL", "MASTER", self.service)
            except redis.RedisError as exc:
                raise LookupError(f"sentinel {sentinel.port}: {exc}") from None
            fields = _pairs(state)
            if fields.get("flags") != "master":
                raise LookupError(f"sentinel {sentinel.port}: {fields.get('flags')}")
            answers.add(int(fields["port"]))
        if len(answers) != 1:
            raise LookupError(f"the sentinels name {sorted(answers)}")
        port = answers.pop()
        node = next((n for n in self.nodes if n.port == port and n.running()), None)
        if node is None or self.role(node) != "master":
            raise LookupError(f"the node on port {port} is not a running primary")
        return node

    def role(self, node: ServerProcess) -> str:
        """What *node* says it is (``master``, ``slave``), or ``unknown``."""
        try:
            with self.client(node) as c:
                role = c.info("replication").get("role", "unknown")
        except redis.RedisError:
            return "unknown"
        return str(role)

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the primary, its replicas (synced) and the sentinels, and
        wait until every sentinel knows the primary, the replicas and the
        other sentinels.

        :raises ServerStartError: if a process does not start or the
            sentinels do not settle in time
        """
        binary = self._binary = self._binary or find_server_binary()
        root = self._root()
        primary = ServerProcess(
            binary=binary, workdir=root / "node-0", config=self._config
        )
        self.nodes.append(primary)
        primary.start()
        follow = {"replicaof": ["127.0.0.1", str(primary.port)]}
        for i in range(1, self.replicas + 1):
            node = ServerProcess(
                binary=binary,
                workdir=root / f"node-{i}",
                config={**self._config, **follow},
            )
            self.nodes.append(node)
            node.start()
        self._wait(lambda: self._synced(primary), "the replicas did not sync")
        lines = [
            f"sentinel monitor {self.service} 127.0.0.1 {primary.port} {self.quorum}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.service} 1",
        ]
        for i in range(self.sentinel_count):
            sentinel = _SentinelProcess(
                binary=binary, workdir=root / f"sentinel-{i}", lines=lines
            )
            self.sentinels.append(sentinel)
            sentinel.start()
        self.wait_settled()

    def _root(self) -> Path:
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
            return self._dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="aiogroupq-sentinel-")
        return Path(self._tmp.name)

    def _wait(self, done: Any, what: str, timeout: float = SETTLE_TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if found := done():
                    return found
            except (redis.RedisError, LookupError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(self._binary, f"{what} in {timeout:g} s")
            time.sleep(0.1)

    def _synced(self, primary: ServerProcess) -> bool:
        """Whether every other running data node is a replica of *primary*
        with its link up (a former primary started again is a primary, an
        empty one without AOF, until a sentinel turns it into a replica)."""
        for node in self.nodes:
            if node is primary or not node.running():
                continue
            with self.client(node) as c:
                info = c.info("replication")
            if (
                info.get("role") != "slave"
                or int(info.get("master_port", 0)) != primary.port
                or info.get("master_link_status") != "up"
            ):
                return False
        return True

    def wait_settled(self, timeout: float = SETTLE_TIMEOUT) -> ServerProcess:
        """Wait until every sentinel names one running primary, knows the
        other sentinels and at least the running replicas, and every running
        replica is synced; return the primary.

        :raises ServerStartError: if that does not happen in *timeout*
        """

        def settled() -> ServerProcess | None:
            primary = self.primary()
            running_replicas = sum(
                1 for n in self.nodes if n.running() and n is not primary
            )
            for sentinel in self.sentinels:
                if not sentinel.running():
                    continue
                with self.client(sentinel) as c:
                    state = _pairs(
                        c.execute_command("SENTINEL", "MASTER", self.service)
                    )
                    replicas = c.execute_command("SENTINEL", "REPLICAS", self.service)
                others = int(state.get("num-other-sentinels", 0))
                if others < sum(1 for s in self.sentinels if s.running()) - 1:
                    return None
                healthy = [
                    r for r in map(_pairs, replicas) if "down" not in r.get("flags", "")
                ]
                if len(healthy) < running_replicas:
                    return None
            return primary if self._synced(primary) else None

        found: ServerProcess = self._wait(
            settled, "the sentinels did not settle", timeout
        )
        return found

    def kill(self, node: ServerProcess) -> None:
        """``kill -9`` one process (the primary: a replica takes over)."""
        node.kill()

    def wait_promoted(
        self, old: ServerProcess, timeout: float = SETTLE_TIMEOUT
    ) -> ServerProcess:
        """Wait until the sentinels agree on a primary other than *old*,
        and it says it is one; return it.

        :raises ServerStartError: if that does not happen in *timeout*
        """

        def promoted() -> ServerProcess | None:
            primary = self.primary()
            return None if primary is old else primary

        found: ServerProcess = self._wait(promoted, "no replica was promoted", timeout)
        return found

    def restart(self, node: ServerProcess) -> None:
        """Start a killed data node again on its port and directory (the
        sentinels turn a former primary into a replica of the new one)."""
        node.start()

    def close(self) -> None:
        """Stop every process and remove the temporary directory."""
        for process in [*self.sentinels, *self.nodes]:
            process.stop()
        self.sentinels = []
        self.nodes = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _pairs(reply: Any) -> dict[str, str]:
    """A sentinel's flat ``[name, value, ...]`` reply (or map) as text."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[::2], reply[1::2], strict=False))
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in items
    }
