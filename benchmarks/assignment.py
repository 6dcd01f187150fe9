"""The consumer-side partition assignment, simulated (no servers):
``python -m benchmarks.assignment [--nodes 10,100,1000]
[--consumers 10,100,1000,10000] [--per-node 8] [--replicas 2] [--samples 3]``.

For each cluster of N primaries holding K = N x ``--per-node`` partitions and
each fleet of C consumer processes (random names, as consumers generate
them), the assignment every consumer computes (``_store/assignment.py``,
the library's own function) is worked out, then again with one consumer
more (a join) and one fewer (a leave), ``--samples`` times each. Printed per
cell:

- ``max/mean``: the largest share against the mean r*K/C (and the
  promised bound ``ceil(r*K/C) + r``); ``idle``: consumers with no
  partition (they stand by: fewer than r*K slots for C consumers);
- ``join``, ``leave``: (partition, consumer) pairs that change, mean over
  the samples, as a multiple of what must move at least (the newcomer's
  share, the leaver's share);
- ``conns``: blocking connections per consumer (one per partition of its
  share: the largest), against K before (every consumer served every
  partition); a consumer holds a few more for claims, outcomes and
  heartbeats (measured on a 3-primary cluster: share + 3 to 6);
- ``claims/node/s``: the claims an idle queue costs each node per second:
  each fetcher claims once per :data:`~aiogroupq._work.fetcher.MAX_BLOCK`
  when its blocking pop times out, so r*K/N per second, against C*K/N
  before;
- ``registry/s``: names the consumers read from the registry per second
  (each reads the C live names every third of its lease, 30 s here), all
  from partition 0's node: C*C/10;
- ``ms``: one computation of the assignment (a change of membership; a
  fleet of more than 500 computes it off the event loop).
"""

from __future__ import annotations

import argparse
import random
import secrets
import statistics
import time
from collections.abc import Sequence

from aiogroupq._store.assignment import assign
from aiogroupq._store.registry import BEATS_PER_LEASE
from aiogroupq._work.fetcher import MAX_BLOCK

#: the consumers' lease assumed for the registry's reads (the default)
LEASE = 30.0


def _names(count: int, rng: random.Random) -> list[str]:
    """Consumer names as generated: host, pid and 64 random bits."""
    return [
        f"host-{rng.randrange(count):05d}:{rng.randrange(1, 4 * 10**6)}:"
        f"{rng.getrandbits(64):016x}"
        for _ in range(count)
    ]


def _moved(before: dict[str, frozenset[int]], after: dict[str, frozenset[int]]) -> int:
    return sum(
        len(share - before.get(name, frozenset())) for name, share in after.items()
    )


def cell(
    nodes: int, consumers: int, per_node: int, replicas: int, samples: int, seed: int
) -> dict[str, float]:
    """One row of the table."""
    rng = random.Random(seed)
    partitions = nodes * per_node
    fleet = _names(consumers, rng)
    started = time.perf_counter()
    shares = assign(partitions, fleet, replicas)
    took = time.perf_counter() - started
    sizes = [len(share) for share in shares.values()]
    r = min(replicas, consumers)
    mean = r * partitions / consumers
    joins, leaves = [], []
    for _ in range(samples):
        newcomer = f"joiner:{secrets.token_hex(8)}"
        after = assign(partitions, [*fleet, newcomer], replicas)
        joins.append(_moved(shares, after) / max(1, len(after[newcomer])))
        leaver = rng.choice(fleet)
        after = assign(partitions, [n for n in fleet if n != leaver], replicas)
        leaves.append(_moved(shares, after) / max(1, len(shares[leaver])))
    slots = sum(sizes)
    return {
        "nodes": nodes,
        "K": partitions,
        "C": consumers,
        "max": max(sizes),
        "mean": mean,
        "bound": -(-r * partitions // consumers) + r,
        "idle": sum(1 for size in sizes if size == 0),
        "join": statistics.mean(joins),
        "join_max": max(joins),
        "leave": statistics.mean(leaves),
        "leave_max": max(leaves),
        "conns": max(sizes),
        "conns_before": partitions,
        "claims": slots / nodes / MAX_BLOCK,
        "claims_before": consumers * partitions / nodes / MAX_BLOCK,
        "registry": consumers * consumers / (LEASE / BEATS_PER_LEASE),
        "ms": took * 1000,
    }


def _count(value: float) -> str:
    """A count in a few characters: 16, 1.6k, 80M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            scaled = value / limit
            return f"{scaled:.0f}{suffix}" if scaled >= 10 else f"{scaled:.1f}{suffix}"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _mean(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


HEADERS = (
    "nodes", "K", "C", "max/mean (bound)", "idle", "join x", "leave x",
    "conns (before)", "claims/node/s (before)", "registry/s", "ms",
)  # fmt: skip


def row(c: dict[str, float]) -> tuple[str, ...]:
    return (
        f"{c['nodes']:.0f}",
        f"{c['K']:.0f}",
        f"{c['C']:.0f}",
        f"{c['max']:.0f}/{_mean(c['mean'])} ({c['bound']:.0f})",
        f"{c['idle']:.0f}",
        f"{c['join']:.1f} (<={c['join_max']:.1f})",
        f"{c['leave']:.1f} (<={c['leave_max']:.1f})",
        f"{c['conns']:.0f} ({c['conns_before']:.0f})",
        f"{_count(c['claims'])} ({_count(c['claims_before'])})",
        _count(c["registry"]),
        f"{c['ms']:.0f}",
    )


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.assignment", description=__doc__.split("\n\n")[0]
    )

    def ints(text: str) -> list[int]:
        return [int(part) for part in text.split(",") if part]

    parser.add_argument("--nodes", type=ints, default=[10, 100, 1000])
    parser.add_argument("--consumers", type=ints, default=[10, 100, 1000, 10000])
    parser.add_argument("--per-node", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = []
    for nodes in args.nodes:
        for consumers in args.consumers:
            found = cell(
                nodes, consumers, args.per_node, args.replicas, args.samples, args.seed
            )
            rows.append(row(found))
    print(
        f"r = {args.replicas}, K = nodes x {args.per_node}, lease {LEASE:.0f} s, "
        f"{args.samples} joins and leaves per cell\n" + table(rows)
    )
    print(f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
