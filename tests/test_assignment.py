"""The assignment of partitions to consumers (``_store/assignment.py``), a
pure function: every partition served by min(r, C) consumers, no consumer
over ``ceil(r*K/C) + r``, the same answer in every process, few moves when
a consumer joins or leaves; and ``aiogroupq worker --partition-replicas``.
The consumers following it are tested in ``test_partitions.py`` (one
server) and ``test_cluster.py`` (6 processes, 24 partitions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio
from hypothesis import given, settings, strategies as st

import aiogroupq
from aiogroupq import ConfigurationError, Producer
from aiogroupq._store.assignment import (
    assign,
    check_partition_replicas,
    max_share,
    parse_share,
    share_of,
    share_text,
)

if TYPE_CHECKING:
    from ._spawn import Spawn

names = st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=40, unique=True)
counts = st.integers(min_value=1, max_value=300)
replicas = st.integers(min_value=1, max_value=4)


def _coverage(partitions: int, shares: dict[str, frozenset[int]]) -> list[int]:
    served = [0] * partitions
    for share in shares.values():
        for p in share:
            served[p] += 1
    return served


@settings(max_examples=150, deadline=None)
@given(counts, names, replicas)
def test_every_partition_is_served_by_r_consumers_none_over_the_bound(
    partitions: int, consumers: list[str], r: int
) -> None:
    shares = assign(partitions, consumers, r)
    assert set(shares) == set(consumers)
    c = len(consumers)
    served = _coverage(partitions, shares)
    if partitions == 1 or c <= r:
        # Served whole by everyone: a queue of one partition as always.
        assert served == [c] * partitions
    else:
        assert served == [r] * partitions
    # The bound, r capped by the fleet: ceil(r*K/C) + r.
    capped = min(r, c)
    bound = -(-capped * partitions // c) + capped
    assert max(len(s) for s in shares.values()) <= max_share(partitions, c, r) <= bound
    assert all(s <= frozenset(range(partitions)) for s in shares.values())


@settings(max_examples=60, deadline=None)
@given(counts, names, replicas, st.randoms(use_true_random=False))
def test_the_same_names_in_any_order_give_the_same_assignment(
    partitions: int, consumers: list[str], r: int, rng: object
) -> None:
    shuffled = list(consumers)
    rng.shuffle(shuffled)  # type: ignore[attr-defined]
    assert assign(partitions, consumers, r) == assign(
        partitions, shuffled + shuffled, r
    )
    for name in consumers:
        assert (
            share_of(partitions, shuffled, r, name)
            == assign(partitions, consumers, r)[name]
        )


def _moved(before: dict[str, frozenset[int]], after: dict[str, frozenset[int]]) -> int:
    """(partition, consumer) pairs served after that were not before."""
    return sum(
        len(share - before.get(name, frozenset())) for name, share in after.items()
    )


@pytest.mark.parametrize(
    ("partitions", "consumers"), [(24, 6), (80, 10), (96, 7), (200, 50), (64, 100)]
)
def test_a_join_or_a_leave_moves_few_partitions(
    partitions: int, consumers: int
) -> None:
    fleet = [f"host-{i}:{1000 + i}:{i * 7919:016x}" for i in range(consumers)]
    before = assign(partitions, fleet, 2)
    # What must move: the newcomer's share, or the leaver's. A little more
    # moves where consumers at the cap shed partitions to others, most when
    # the cap itself changes; never more than a tenth of all.
    few = 2 * partitions // 10 + 2 * max_share(partitions, consumers, 2)
    for newcomer in ("joiner-a", "joiner-b", "joiner-c"):
        after = assign(partitions, [*fleet, newcomer], 2)
        assert len(after[newcomer]) <= _moved(before, after) <= few
    for leaver in fleet[:3]:
        after = assign(partitions, [n for n in fleet if n != leaver], 2)
        assert _moved(before, after) <= few
        # Its partitions are served by others now.
        assert all(sum(p in s for s in after.values()) == 2 for p in before[leaver])


def test_a_small_fleet_and_one_partition_serve_everything() -> None:
    assert assign(1, ["a", "b", "c", "d"], 2) == dict.fromkeys("abcd", frozenset({0}))
    assert assign(8, ["a", "b"], 2) == dict.fromkeys("ab", frozenset(range(8)))
    assert assign(8, ["a"], 3) == {"a": frozenset(range(8))}
    assert assign(8, [], 2) == {}
    # A consumer always counts itself, read from the registry or not.
    assert share_of(8, [], 2, "alone") == frozenset(range(8))


def test_a_big_fleet_leaves_consumers_standing_by_without_growing_claims() -> None:
    fleet = [f"c{i}" for i in range(100)]
    shares = assign(8, fleet, 2)
    assert sum(len(s) for s in shares.values()) == 16  # r x K, not C x K
    assert sum(1 for s in shares.values() if not s) >= 100 - 16


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(min_value=0, max_value=16383), max_size=60))
def test_a_share_reads_back_as_written(share: set[int]) -> None:
    text = share_text(share)
    assert parse_share(text) == tuple(sorted(share))
    assert " " not in text


def test_shares_are_written_as_ranges_and_junk_reads_as_unknown() -> None:
    assert share_text([0, 1, 2, 3, 8, 12, 13]) == "0-3,8,12-13"
    assert share_text([]) == ""
    assert parse_share("") == ()
    for junk in ("x", "3-", "5-2", "-1", "0-99999", "1,,2-x"):
        assert parse_share(junk) is None


@pytest.mark.parametrize("bad", [0, -1, 1025, 2.0, True, "2", None])
def test_partition_replicas_must_be_a_sensible_int(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="partition_replicas"):
        check_partition_replicas(bad)
    assert check_partition_replicas(3) == 3


# -- aiogroupq worker --partition-replicas -------------------------------------------


@pytest.mark.parametrize(
    ("target", "value", "message"),
    [
        ("tests.example_app:handlers", "0", "--partition-replicas: must be >= 1"),
        ("tests.example_app:make_consumer", "2", "applies to a mapping"),
    ],
)
async def test_a_bad_partition_replicas_exits_2(
    target: str, value: str, message: str, spawn: Spawn
) -> None:
    proc = spawn(
        "worker",
        target,
        *("--queue", "q", "--partition-replicas", value),
        *("--redis-url", "redis://127.0.0.1:1/0"),
    )
    assert await proc.wait() == 2
    assert message in proc.output, proc.output


@pytest.mark.slow
async def test_workers_with_one_replica_split_the_partitions(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn
) -> None:
    async with Producer(redis_client, queue="split", partitions=6):
        pass
    for i in range(2):
        spawn(
            "worker",
            "tests.example_app:handlers",
            *("--queue", "split", "--redis-url", redis_url, "--name", f"split-{i}"),
            *("--partition-replicas", "1", "--lease-ttl", "1.5"),
        )
    want = assign(6, ["split-0", "split-1"], 1)
    async with aiogroupq.Admin(redis_client, queue="split") as admin:
        with anyio.fail_after(60):
            while {c.name: c.partitions for c in await admin.consumers()} != {
                name: tuple(sorted(share)) for name, share in want.items()
            }:
                await anyio.sleep(0.1)
    assert sorted(p for share in want.values() for p in share) == list(range(6))
