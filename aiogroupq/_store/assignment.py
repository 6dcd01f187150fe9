"""Which consumers serve which partitions: a pure function of the partition
count, the live consumers' names and the replica count, so that every
consumer that reads the same registry computes the same assignment, with no
coordinator and no barrier.

Consistent hashing with bounded loads (after Mirrokni, Thorup and
Zadimoghaddam, 2018): each consumer stands at :data:`POINTS` places on a
ring of 44-bit hashes of its name, and each partition at one place of its
own. A partition goes to the first *r* distinct consumers met clockwise from
its place; then every consumer over the cap ``ceil(r*K/C)`` sheds its
highest partitions, each to the next consumer of that partition's walk with
room. So the shares are even (none over the mean rounded up, well within the
promised ``ceil(r*K/C) + r``), a consumer that joins takes mostly its own
arcs, and one that leaves hands its arcs to its neighbours; what else moves
is what the cap makes consumers shed, most when the cap itself changes (the
fleet crossing a multiple of r*K/C). Where every consumer below the cap
already serves a shed partition, a full consumer hands a partition of its
own to one with room and takes the shed one instead (:func:`_swap`): the cap
always holds and every partition always gets its *r*.

Rendezvous hashing (each partition ranks every consumer) gives the same
spread, but costs K x C hashes per change of membership (80 million at 1,000
nodes and 10,000 consumers); the ring costs C x :data:`POINTS` hashes, cached
by name, plus a sort.

A queue of one partition is served by every consumer (as it always was), and
so is every partition while the fleet has no more consumers than *r*.
Safety never rests on this: a claim is atomic per partition, so two
consumers that disagree for a moment both serve a partition, which is
harmless, and a partition nobody serves waits until the next reading of the
registry.
"""

from __future__ import annotations

__all__ = (
    "DEFAULT_PARTITION_REPLICAS",
    "assign",
    "check_partition_replicas",
    "max_share",
    "parse_share",
    "share_of",
    "share_text",
)

import bisect
import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Final

from ..errors import ConfigurationError
from .partition import MAX_PARTITIONS

#: consumers that serve each partition, by default (``partition_replicas``):
#: two, so that a consumer's death leaves each of its partitions served
#: while the registry notices it
DEFAULT_PARTITION_REPLICAS: Final = 2
#: places of each consumer on the ring: more even arcs, at more hashing
POINTS: Final = 64
_PLACE_BITS: Final = 44
_INDEX_BITS: Final = 20
_INDEX_MASK: Final = (1 << _INDEX_BITS) - 1
#: partitions a consumer may serve above the mean rounded up: each one
#: more moves fewer partitions when the fleet changes (a third fewer at a
#: cap change, benchmarks/assignment.py) but lets the shares spread apart
#: (2 and 7 of 8 partitions for 3 consumers); a moved partition costs a
#: fetcher started and one stopped, an uneven share costs throughput
_SLACK: Final = 0
#: most replicas a user may ask for (a consumer per partition and then some)
_MAX_REPLICAS: Final = 1024


def check_partition_replicas(value: object) -> int:
    """A ``partition_replicas`` given by a user: an int from 1 to 1024."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= _MAX_REPLICAS
    ):
        raise ConfigurationError(
            f"partition_replicas must be an int from 1 to {_MAX_REPLICAS}, "
            f"got {value!r}"
        )
    return value


def _hash(text: str) -> int:
    """A 44-bit place on the ring: with a consumer's index below it, an int
    that sorts fast (a million consumers at most)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest()) >> (64 - _PLACE_BITS)


@functools.lru_cache(maxsize=1 << 16)
def _points(name: str) -> tuple[int, ...]:
    """*name*'s places on the ring (its length in front: no two names share
    a hashed text)."""
    return tuple(_hash(f"c{len(name)}:{name}:{i}") for i in range(POINTS))


@functools.lru_cache(maxsize=65536)
def _start(partition: int) -> int:
    return _hash(f"p:{partition}")


def max_share(partitions: int, consumers: int, replicas: int) -> int:
    """The most partitions one of *consumers* live consumers serves:
    ``ceil(r*K/C)``, within the promised ``ceil(r*K/C) + r`` (K itself for
    one partition, or a fleet no larger than r)."""
    if consumers <= 0:
        return 0
    if partitions == 1 or consumers <= replicas:
        return partitions
    return -(-replicas * partitions // consumers) + _SLACK


def assign(
    partitions: int, consumers: Sequence[str], replicas: int
) -> dict[str, frozenset[int]]:
    """Each consumer's share of partitions ``0..partitions-1``.

    Every partition gets ``min(replicas, len(consumers))`` distinct
    consumers, no consumer more than :func:`max_share`; the same arguments
    give the same answer in every process (the order of *consumers* does
    not matter; repeated names count once).
    """
    names = sorted(set(consumers))
    count = len(names)
    if count == 0:
        return {}
    if partitions == 1 or count <= replicas:
        everything = frozenset(range(partitions))
        return dict.fromkeys(names, everything)
    return dict(_assign(partitions, tuple(names), replicas))


@functools.lru_cache(maxsize=8)
def _assign(
    partitions: int, names: tuple[str, ...], replicas: int
) -> dict[str, frozenset[int]]:
    cap = max_share(partitions, len(names), replicas)
    ring = _Ring(names)
    # Plain consistent hashing first: each partition's first r consumers
    # clockwise. Then each consumer over the cap sheds its highest
    # partitions, each to the next consumer of that partition's walk with
    # room. A change of the cap (the fleet crossing r*K/C) then moves only
    # what is shed, not every later partition as a greedy fill would.
    holders = [ring.walk(p, replicas) for p in range(partitions)]
    served: list[list[int]] = [[] for _ in names]
    for partition, chosen in enumerate(holders):
        for who in chosen:
            served[who].append(partition)
    shed: list[tuple[int, int]] = []
    for who, parts in enumerate(served):
        if len(parts) > cap:
            shed.extend((partition, who) for partition in parts[cap:])
            del parts[cap:]
    for partition, who in sorted(shed):
        chosen = holders[partition]
        chosen.remove(who)
        taker = ring.next_with_room(partition, chosen, served, cap)
        if taker is None:
            taker = _swap(partition, ring, holders, served)
        chosen.append(taker)
        served[taker].append(partition)
    return {name: frozenset(parts) for name, parts in zip(names, served, strict=True)}


class _Ring:
    """The consumers' places on the ring, in order."""

    def __init__(self, names: tuple[str, ...]) -> None:
        # One int per place, its consumer's index in the low bits: a sort
        # of plain ints, and equal hashes of two names ordered by name.
        places = sorted(
            (point << _INDEX_BITS) | index
            for index, name in enumerate(names)
            for point in _points(name)
        )
        self._places = places
        self._owners = [place & _INDEX_MASK for place in places]

    def around(self, partition: int) -> Iterator[int]:
        """The consumers clockwise from *partition*'s place, once round
        (each as often as it has places)."""
        owners = self._owners
        at = bisect.bisect_left(self._places, _start(partition) << _INDEX_BITS)
        for i in range(at, len(owners)):
            yield owners[i]
        for i in range(at):
            yield owners[i]

    def walk(self, partition: int, replicas: int) -> list[int]:
        """*partition*'s first *replicas* distinct consumers clockwise."""
        chosen: list[int] = []
        for who in self.around(partition):
            if who not in chosen:
                chosen.append(who)
                if len(chosen) == replicas:
                    break
        return chosen

    def next_with_room(
        self, partition: int, chosen: list[int], served: list[list[int]], cap: int
    ) -> int | None:
        """The first consumer clockwise from *partition* below the cap and
        not among *chosen*; None when every one below the cap is chosen."""
        return next(
            (
                who
                for who in self.around(partition)
                if len(served[who]) < cap and who not in chosen
            ),
            None,
        )


def _swap(
    partition: int,
    ring: _Ring,
    holders: list[list[int]],
    served: list[list[int]],
) -> int:
    """The consumer that takes *partition* when every consumer below the cap
    already serves it: the first full one on its walk (X), which hands a
    partition of its own to the chosen consumer with most room (Y).

    Y exists: the loads sum to less than C x cap (*partition* lacks one),
    and every consumer but the chosen ones is full. A partition of X that Y does
    not serve exists: X serves ``cap`` of them, Y fewer."""
    chosen = holders[partition]
    full = next(who for who in ring.around(partition) if who not in chosen)
    room = min(chosen, key=lambda who: (len(served[who]), who))
    moved = next(p for p in served[full] if room not in holders[p])
    served[full].remove(moved)
    holders[moved][holders[moved].index(full)] = room
    served[room].append(moved)
    return full


def share_of(
    partitions: int, consumers: Iterable[str], replicas: int, name: str
) -> frozenset[int]:
    """The partitions *name* serves among *consumers* (*name* counted among
    them: a consumer always counts itself alive)."""
    return assign(partitions, sorted({*consumers, name}), replicas)[name]


def share_text(share: Iterable[int]) -> str:
    """A share as the registry stores it: ``"0-3,8,12-13"`` (``""``: none)."""
    runs: list[str] = []
    ordered = sorted(share)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def parse_share(text: str) -> tuple[int, ...] | None:
    """The partitions a stored share names, in order; ``None`` for a text
    no version of aiogroupq writes."""
    found: set[int] = set()
    try:
        for run in filter(None, text.split(",")):
            first, dash, last = run.partition("-")
            low, high = int(first), int(last if dash else first)
            if not 0 <= low <= high < MAX_PARTITIONS:
                return None
            found.update(range(low, high + 1))
    except ValueError:
        return None
    return tuple(sorted(found))
