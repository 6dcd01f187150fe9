"""The check on a Redis Cluster: a problem found in the first reading is
read again in one transaction where the client has cluster transactions
(redis-py 6 and later), else in a plain pipeline (redis-py 5 refuses
``MULTI`` on a cluster client before sending anything), and reported; a
clean queue stays clean."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq._check import problems as _problems
from aiogroupq._check.check import examine
from aiogroupq._store.keys import QueueKeys
from aiogroupq.testing._cluster_server import ClusterProcess
from aiogroupq.testing._server import find_server_binary

QUEUE = "check-on-a-cluster"


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterProcess]:
    try:
        find_server_binary()
    except Exception as exc:  # noqa: BLE001 - no server binary on this machine
        pytest.skip(f"no server binary: {exc}")
    with ClusterProcess(masters=3) as running:
        yield running


@pytest.fixture
async def cluster_client(cluster: ClusterProcess) -> AsyncIterator[RedisCluster]:
    first = cluster.primaries()[0]
    client = RedisCluster(host="127.0.0.1", port=first.port)
    await client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_damaged_queue_on_a_cluster_is_reported_not_unavailable(
    cluster_client: RedisCluster,
) -> None:
    async with aiogroupq.Producer(cluster_client, queue=QUEUE) as producer:
        await producer.enqueue("t", 1, group="g")
    assert (await examine(cluster_client, QUEUE)).problems == []
    # A ready entry with no task behind it: found by the first reading,
    # read again by the second, reported.
    await cluster_client.rpush(QueueKeys(QUEUE).ready, "no-such-task")
    found = await examine(cluster_client, QUEUE)
    kinds = {p.kind for p in found.problems}
    assert kinds & {_problems.ORPHAN_ENTRY, _problems.LOST_TASK}, found.problems
