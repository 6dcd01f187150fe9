"""The check on a Redis Cluster: a problem found in the first reading is
read again in one transaction where the client has cluster transactions
(redis-py 6 and later), else in a plain pipeline (redis-py 5 refuses
``MULTI`` on a cluster client before sending anything), and reported; a
clean queue stays clean."""

from __future__ import annotations

from redis.asyncio.cluster import RedisCluster

import aiogroupq
from aiogroupq._check import problems as _problems
from aiogroupq._check.check import examine
from aiogroupq._store.keys import QueueKeys

QUEUE = "check-on-a-cluster"


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
