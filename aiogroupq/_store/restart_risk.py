"""The supervisor's trap, where the server shows it: a primary with replicas
and no AOF. Killed and restarted (by systemd, Kubernetes, a supervisor)
before its failover, it comes back empty (or with its last snapshot) and
still a primary, and its replicas copy that: every acknowledged task since
is gone, ``durability="replicated"`` or not (docs/high-availability.md).

Advisory: a server that refuses ``INFO`` or ``CONFIG GET`` (a least-privilege
user, a managed service) shows nothing, and nothing is said.
"""

from __future__ import annotations

__all__ = ("restart_risk",)

from typing import Any

import anyio
from redis.asyncio.cluster import ClusterNode, RedisCluster

from .connection import CALL_BUDGET, REDIS_FAILURES, Client, address_of


async def restart_risk(client: Client) -> str | None:
    """A warning if a primary that *client* writes to has replicas and no
    AOF, else ``None`` (also when the server will not tell).

    A few round trips per primary (``INFO replication``, ``CONFIG GET`` of
    ``appendonly`` and ``save``), each within the budget of a call.
    """
    if isinstance(client, RedisCluster):
        nodes: list[ClusterNode | None] = list(client.get_primaries())
    else:
        nodes = [None]
    for node in nodes:
        where = address_of(client) if node is None else node.name
        try:
            with anyio.fail_after(CALL_BUDGET):
                found = await _one(client, node)
        except (TimeoutError, *REDIS_FAILURES):
            continue
        if found is not None:
            replicas, snapshots = found
            kept = (
                "its last RDB snapshot"
                if snapshots
                else "nothing (no AOF, no RDB snapshots)"
            )
            return (
                f"the primary at {where} has {replicas} replica(s) and no AOF "
                "(appendonly no): if it is restarted before its failover (by a "
                f"supervisor, systemd, Kubernetes), it comes back with {kept} "
                "and its replicas copy that, losing the tasks acknowledged "
                "since, durability='replicated' or not. Turn AOF on on every "
                "node (appendonly yes), or delay its restart past the failure "
                "detection (Sentinel's down-after-milliseconds, "
                "cluster-node-timeout): see docs/high-availability.md"
            )
    return None


async def _one(client: Client, node: ClusterNode | None) -> tuple[int, bool] | None:
    """(replicas, RDB snapshots on) of a primary without AOF, or None."""
    target: dict[str, Any] = {} if node is None else {"target_nodes": node}
    info: Any = await client.execute_command("INFO", "replication", **target)
    if isinstance(info, bytes | str):
        text = info.decode() if isinstance(info, bytes) else info
        info = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    replicas = int(info.get("connected_slaves", 0))
    if info.get("role") != "master" or replicas < 1:
        return None
    config = await client.execute_command("CONFIG", "GET", "appendonly", **target)
    values = _pairs(config)
    if values.get("appendonly", "no") != "no":
        return None
    save = await client.execute_command("CONFIG", "GET", "save", **target)
    return replicas, bool(_pairs(save).get("save", "").strip())


def _pairs(reply: Any) -> dict[str, str]:
    if isinstance(reply, list | tuple):
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else str(v)
        )
        for k, v in dict(reply).items()
    }
