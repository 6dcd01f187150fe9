"""Consumer processes that share a queue's partitions, and counting the
connections each holds to the servers (for ``test_cluster.py`` and the
figures of docs/scaling.md).

A process's connections are told apart by its local ports: its sockets'
inodes (``/proc/<pid>/fd``) looked up in its ``/proc/<pid>/net/tcp``, then
matched against the ``addr`` of each server's ``CLIENT LIST``: what the
servers see, which is what a connection costs them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import anyio
import redis

import aiogroupq

from ._journal import Flag, Journal, client_for, make_handlers


def local_ports(pid: int) -> set[int]:
    """The local TCP ports of process *pid*'s sockets (Linux ``/proc``)."""
    inodes: set[str] = set()
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir() if fds.exists() else ():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


#: the client name of the consumers' connections (not the journal's)
CONSUMER_CLIENT = "share-consumer"


def connections_of(pid: int, servers: Iterable[redis.Redis]) -> int:
    """How many connections of its consumer the *servers* list from process
    *pid* (its journal's are not counted)."""
    ports = local_ports(pid)
    held = 0
    for server in servers:
        for entry in server.client_list():
            port = int(str(entry.get("addr", ":0")).rsplit(":", 1)[1])
            held += port in ports and entry.get("name") == CONSUMER_CLIENT
    return held


def consume_sharing(
    url: str,
    queue: str,
    ready: Flag,
    stop: Flag,
    journal_key: str,
    replicas: int,
    lease_ttl: float,
) -> None:
    """Target of a ``spawn`` child: consume *queue* (journaling each run)
    with ``partition_replicas=replicas`` until *stop* is set."""
    anyio.run(
        _consume,
        url,
        queue,
        ready,
        stop,
        journal_key,
        replicas,
        lease_ttl,
        backend="asyncio",
    )


async def _consume(
    url: str,
    queue: str,
    ready: Flag,
    stop: Flag,
    journal_key: str,
    replicas: int,
    lease_ttl: float,
) -> None:
    client = client_for(url)
    try:
        sep = "&" if "?" in url else "?"
        async with aiogroupq.Consumer(
            f"{url}{sep}client_name={CONSUMER_CLIENT}",
            queue=queue,
            handlers=make_handlers(Journal(client, key=journal_key)),
            concurrency=8,
            grace_period=10.0,
            lease_ttl=lease_ttl,
            partition_replicas=replicas,
        ):
            ready.set()
            while not stop.is_set():
                await anyio.sleep(0.05)
    finally:
        await client.aclose()
