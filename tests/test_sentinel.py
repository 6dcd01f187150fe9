"""Redis Sentinel: the ``redis+sentinel://`` URL (``_store/sentinel.py``),
and a producer, a consumer and ``aiogroupq stats`` following a failover by
themselves, on a real deployment (a primary, a replica and three sentinels,
``aiogroupq.testing._sentinel_server.SentinelSet``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio
from redis.asyncio.sentinel import Sentinel

import aiogroupq
from aiogroupq import ConfigurationError
from aiogroupq._store import sentinel as _sentinel
from aiogroupq._store.connection import address_of, new_client, safe_url
from aiogroupq._store.restart_risk import restart_risk
from aiogroupq.testing._client import flushed_client
from aiogroupq.testing._sentinel_server import SentinelSet
from aiogroupq.testing._server import ServerStartError

from ._errorstats import error_count

if TYPE_CHECKING:
    from ._spawn import Spawn

QUEUE = "sentinel"
#: liveness only: how long a state may take to come
PATIENCE = 60.0


# -- the URL (no server) ---------------------------------------------------------


def test_a_full_url_parses() -> None:
    parsed = _sentinel.parse(
        "redis+sentinel://app:s%40cret@h1:26380,h2,[::1]:26381/orders/3"
        "?sentinel_username=watch&sentinel_password=w%26tch&socket_timeout=7"
        "&min_other_sentinels=1&sentinel_socket_timeout=0.5"
    )
    assert parsed.sentinels == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert parsed.service == "orders"
    assert parsed.db == 3
    # user:password@ are the data node's credentials, as master_for takes them
    assert parsed.node == {
        "db": 3,
        "username": "app",
        "password": "s@cret",
        "socket_timeout": 7.0,
    }
    assert parsed.sentinel["username"] == "watch"
    assert parsed.sentinel["password"] == "w&tch"
    assert parsed.sentinel["socket_timeout"] == 0.5
    assert "ssl" not in parsed.sentinel
    assert parsed.min_other_sentinels == 1
    assert parsed.where() == (
        "the primary of Sentinel service 'orders' "
        "(sentinels h1:26380,h2:26379,[::1]:26381)"
    )


def test_tls_reaches_the_data_nodes_and_the_sentinels_unless_told() -> None:
    both = _sentinel.parse("rediss+sentinel://h/m?ssl_ca_certs=/ca.pem")
    assert both.node["ssl"] is True
    assert both.node["ssl_ca_certs"] == "/ca.pem"
    assert both.sentinel["ssl"] is True
    assert both.sentinel["ssl_ca_certs"] == "/ca.pem"
    nodes_only = _sentinel.parse("rediss+sentinel://h/m?sentinel_ssl=no")
    assert nodes_only.node["ssl"] is True
    assert "ssl" not in nodes_only.sentinel


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h1:26379", "no Sentinel service name"),
        ("redis+sentinel://h1:26379/", "no Sentinel service name"),
        ("redis+sentinel://h1:port/m", "the port must be a number from 1 to 65535"),
        ("redis+sentinel://h1:0/m", "the port must be a number from 1 to 65535"),
        ("redis+sentinel://h1:65536/m", "the port must be a number from 1 to 65535"),
        ("redis+sentinel://h1,,h2/m", "a sentinel's address is missing"),
        ("redis+sentinel:///m", "a sentinel's address is missing"),
        ("redis+sentinel://::1/m", "put an IPv6 address in brackets"),
        ("redis+sentinel://h/m/x", "the database 'x' after the service name"),
        ("redis+sentinel://h/m/0/1", "it is /<service>[/<db>]"),
        (
            "redis+sentinel://h/m?sentinel_pasword=x",
            "unknown option 'sentinel_pasword'",
        ),
        ("redis+sentinel://h/m?socket_timeout=soon", "option socket_timeout: must be"),
        ("redis+sentinel://h/m?sentinel_ssl=maybe", "option sentinel_ssl: must be yes"),
        ("redis+sentinel://h/m?ssl_ca_certs=/ca", "only apply over TLS"),
    ],
)
def test_a_bad_url_is_a_configuration_error_that_says_what_to_write(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        new_client(url, retry=True)
    assert says in str(caught.value)


async def test_a_bad_url_is_refused_on_entering_a_producer() -> None:
    with pytest.raises(ConfigurationError, match="no Sentinel service name"):
        async with aiogroupq.Producer("redis+sentinel://127.0.0.1:1", queue=QUEUE):
            pass


def test_both_passwords_are_masked() -> None:
    url = (
        "redis+sentinel://app:nodesecret@h1:26379/m"
        "?sentinel_password=sentinelsecret&socket_timeout=x"
    )
    shown = safe_url(url)
    assert "nodesecret" not in shown
    assert "sentinelsecret" not in shown
    assert shown == (
        "redis+sentinel://app:***@h1:26379/m?sentinel_password=***&socket_timeout=x"
    )
    with pytest.raises(ConfigurationError) as caught:
        new_client(url, retry=True)
    assert "nodesecret" not in str(caught.value)
    assert "sentinelsecret" not in str(caught.value)


async def test_our_client_says_where_it_goes_and_closes_what_it_opened() -> None:
    client = new_client("redis+sentinel://u:pw@h2:2,h1:1/m", retry=True)
    try:
        assert address_of(client) == (
            "the primary of Sentinel service 'm' (sentinels h1:1,h2:2)"
        )
    finally:
        await client.aclose()


# -- a real deployment -------------------------------------------------------------


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[SentinelSet]:
    """A primary, a replica and three sentinels (stopped after the test)."""
    try:
        running = SentinelSet(replicas=1, sentinels=3, workdir=tmp_path / "sentinel")
        running.start()
    except ServerStartError as exc:
        running.close()
        pytest.skip(f"no server binary here runs as a Redis Sentinel: {exc}")
    try:
        yield running
    finally:
        running.close()


class Ran:
    """What the handler ran, and a way to wait for it."""

    def __init__(self) -> None:
        self.payloads: list[int] = []

    async def work(self, n: int) -> None:
        self.payloads.append(n)

    async def wait_for(self, n: int) -> None:
        with anyio.fail_after(PATIENCE):
            while n not in self.payloads:
                await anyio.sleep(0.05)


async def _stats(spawn: Spawn, url: str) -> dict[str, object]:
    proc = spawn("stats", "--queue", QUEUE, "--redis-url", url, "--json")
    assert await proc.wait() == 0, proc.output
    stats: dict[str, object] = json.loads(proc.output)
    return stats


def _succeeded(stats: dict[str, object]) -> int:
    totals = stats["totals"]
    assert isinstance(totals, dict), stats
    return int(totals["succeeded"])


async def _wait_succeeded(url: str, at_least: int) -> None:
    """Wait until the queue counts *at_least* successes (an ack follows the
    handler's return), read through an Admin of the same URL."""
    async with aiogroupq.Admin(url, queue=QUEUE) as admin:
        with anyio.fail_after(PATIENCE):
            while (await admin.stats()).totals["succeeded"] < at_least:
                await anyio.sleep(0.05)


@pytest.fixture
async def roles(
    deployment: SentinelSet,
) -> AsyncIterator[tuple[aiogroupq.Producer, Ran]]:
    """A producer and a running consumer, both on the deployment's URL."""
    ran = Ran()
    async with (
        aiogroupq.Producer(deployment.url, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            deployment.url,
            queue=QUEUE,
            handlers={"work": ran.work},
            concurrency=4,
            retry_backoff=0.2,
        ),
    ):
        yield producer, ran


async def test_the_roles_and_the_cli_follow_a_kill_of_the_primary(
    deployment: SentinelSet,
    roles: tuple[aiogroupq.Producer, Ran],
    spawn: Spawn,
) -> None:
    producer, ran = roles
    await producer.enqueue("work", 1, group="g")
    await ran.wait_for(1)
    await _wait_succeeded(deployment.url, 1)
    assert _succeeded(await _stats(spawn, deployment.url)) == 1
    old = deployment.primary()

    deployment.kill(old)
    new = await anyio.to_thread.run_sync(deployment.wait_promoted, old)
    assert new is not old

    # The same objects, without being told: they ask the sentinels again.
    with anyio.fail_after(PATIENCE):
        while True:
            try:
                await producer.enqueue("work", 2, group="g")
                break
            except aiogroupq.RedisUnavailableError:
                # The budget of one call (5 s) may end before a slow
                # machine's failover does; the next call finds the primary.
                await anyio.sleep(0.2)
    await ran.wait_for(2)
    # The counts live on the primary: the new one counts the second task's
    # success (and the first's, if the replica had it before the kill).
    await _wait_succeeded(deployment.url, 1)
    assert _succeeded(await _stats(spawn, deployment.url)) >= 1


def _primary_port(deployment: SentinelSet) -> int | None:
    try:
        return deployment.primary().port
    except LookupError:
        return None


async def test_a_demoted_primary_s_readonly_reply_is_retried_on_the_new_one(
    deployment: SentinelSet, roles: tuple[aiogroupq.Producer, Ran]
) -> None:
    producer, ran = roles
    await producer.enqueue("work", 1, group="g")
    await ran.wait_for(1)
    await _wait_succeeded(deployment.url, 1)
    old = deployment.primary()
    new = next(n for n in deployment.nodes if n is not old)
    # Swap the roles by hand, as a failover does, but without the client
    # kill a sentinel sends with it: the producer's idle connection to the
    # old primary stays open, and its next write meets READONLY (the
    # window where a sentinel still names the old primary, or an operator
    # switched by hand), which must send it to the new primary.
    with deployment.client(new) as c:
        c.execute_command("REPLICAOF", "NO", "ONE")
    with deployment.client(old) as c:
        c.execute_command("REPLICAOF", "127.0.0.1", new.port)
    for sentinel in deployment.sentinels:
        with deployment.client(sentinel) as c:
            c.execute_command("SENTINEL", "REMOVE", deployment.service)
            c.execute_command(
                "SENTINEL", "MONITOR", deployment.service, "127.0.0.1", new.port, 2
            )
    with anyio.fail_after(PATIENCE):
        while await anyio.to_thread.run_sync(_primary_port, deployment) != new.port:
            await anyio.sleep(0.05)
    await producer.enqueue("work", 2, group="g")
    await ran.wait_for(2)
    # The write did meet the refusal on the old primary, and was sent again.
    with deployment.client(old) as c:
        refused = error_count(c.info("errorstats"), "READONLY")
    assert refused >= 1, refused


async def test_an_enqueue_while_no_primary_is_known_was_never_sent(
    deployment: SentinelSet,
) -> None:
    # Asked where the primary is, the sentinels name none (here they forgot
    # the service; a failover without a replica to promote reads the same):
    # the client connects nowhere, so nothing was sent. It was reported as
    # OutcomeUnknownError, as if the write might have been made.
    async with aiogroupq.Producer(deployment.url, queue=QUEUE) as producer:
        await producer.enqueue("work", 1, group="g")
        for sentinel in deployment.sentinels:
            with deployment.client(sentinel) as c:
                c.execute_command("SENTINEL", "REMOVE", deployment.service)
        # Its next connection asks the sentinels.
        await producer._client.connection_pool.disconnect()  # type: ignore[union-attr]
        with pytest.raises(aiogroupq.RedisUnavailableError) as caught:
            await producer.enqueue("work", 2, group="g")
    print(repr(caught.value))  # noqa: T201
    assert not isinstance(caught.value, aiogroupq.OutcomeUnknownError)
    assert f"Sentinel service {deployment.service!r}" in str(caught.value)


async def test_a_sentinel_client_object_is_the_other_way(
    deployment: SentinelSet,
) -> None:
    hosts = [("127.0.0.1", s.port) for s in deployment.sentinels]
    manager = Sentinel(hosts, socket_timeout=5.0)  # type: ignore[no-untyped-call]
    client: redis.asyncio.Redis = manager.master_for(deployment.service)
    ran = Ran()
    try:
        assert address_of(client).startswith(
            "the primary of Sentinel service 'mymaster'"
        )
        async with (
            aiogroupq.Producer(client, queue=QUEUE) as producer,
            aiogroupq.Consumer(
                client, queue=QUEUE, handlers={"work": ran.work}, concurrency=2
            ),
        ):
            await producer.enqueue("work", 7)
            await ran.wait_for(7)
    finally:
        await client.aclose()
        for sentinel in manager.sentinels:
            await sentinel.aclose()


async def test_a_primary_with_replicas_and_no_aof_is_a_restart_risk(
    deployment: SentinelSet,
) -> None:
    primary = deployment.primary()
    client = new_client(primary.url, retry=True)
    try:
        warning = await restart_risk(client)
        assert warning is not None
        assert "1 replica(s) and no AOF" in warning
        assert "nothing (no AOF, no RDB snapshots)" in warning
        await client.config_set("appendonly", "yes")
        assert await restart_risk(client) is None
    finally:
        await client.aclose()
    replica = next(n for n in deployment.nodes if n is not primary)
    alone = new_client(replica.url, retry=True)
    try:
        assert await restart_risk(alone) is None  # a replica writes nothing
    finally:
        await alone.aclose()


async def test_the_pytest_plugin_takes_a_sentinel_url(deployment: SentinelSet) -> None:
    # REDIS_URL may name a Sentinel service: the plugin's client reaches its
    # primary (a plain client would refuse the scheme).
    async with flushed_client(deployment.url) as client:
        await client.set("probe", "1")
        assert await client.get("probe") == b"1"
        assert (await client.info("replication"))["role"] == "master"
