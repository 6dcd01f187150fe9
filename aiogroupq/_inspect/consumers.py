"""Reading the consumer registry for the views: the registered consumers
(one ``consumers.lua`` call), a consumer's row as :class:`ConsumerInfo`
(``stats.lua`` answers the same rows), and what the registry says of the
consumers of running tasks when a view reads another partition than the
registry's (partition 0 holds it; each other partition's is empty).

What is known of a consumer beyond its registration is worked out here,
read-side only (nothing of it is written): whether its heartbeat is late,
and, for a consumer registered with this machine's host name, whether its
process still runs (``pid_running``). And :func:`check_releasable` says
whether a consumer's tasks may be handed back at once (the hand-back itself,
a write, is ``_store/group_ops.py``'s).
"""

from __future__ import annotations

__all__ = (
    "Beat",
    "ConsumerLiveError",
    "Liveness",
    "check_releasable",
    "consumer_from_row",
    "consumer_list",
    "discount_gone",
    "registry_beats",
    "release_hint",
)

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._store.assignment import parse_share
from .._store.fanout import each_partition
from .._store.keys import QueueKeys
from .._store.registry import BEATS_PER_LEASE, COUNTERS, LATE_BEATS, pid_running
from .._store.replies import text as _text
from .._store.scripts import CONSUMERS
from ..errors import AiogroupqError, ConsumerRunningError
from .raw import (
    as_int as _int,
    opt_int as _opt_int,
    opt_text as _opt_text,
    secs as _secs,
)
from .views import ConsumerInfo, ConsumerState, ConsumerStats, span_text

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.partition import Partitions


@dataclass(frozen=True, slots=True)
class Liveness:
    """What is known of a consumer now.

    :ivar state: alive, silent (its heartbeat is late) or gone
    :ivar status: *state* in words (``ConsumerInfo.status``)
    :ivar registered_alive: the registry counts it alive (its heartbeat is
        within its lease), whatever is known of its process
    :ivar pid_running: whether its process runs, ``None`` if unknown
    :ivar pid_gone: its process is known not to run (registered here)
    """

    state: ConsumerState
    status: str
    registered_alive: bool
    pid_running: bool | None

    @property
    def pid_gone(self) -> bool:
        return self.pid_running is False

    @property
    def releasable(self) -> bool:
        """Whether its tasks may be handed back now: it
        is not counted alive, or its process is known gone."""
        return not self.registered_alive or self.pid_gone


@dataclass(frozen=True, slots=True)
class Beat:
    """A consumer as the registry has it (server ms; each ``None`` if it is
    not registered, or the field is missing).

    :ivar gone_at: when it counts as gone: its latest heartbeat + its lease
    :ivar heartbeat: its latest heartbeat
    :ivar lease_ms: its lease
    :ivar host: the host it registered on
    :ivar pid: its process id there
    :ivar namespace: its pid namespace (``None``: not registered)
    """

    gone_at: int | None = None
    heartbeat: int | None = None
    lease_ms: int | None = None
    host: str | None = None
    pid: int | None = None
    namespace: str | None = None

    def liveness(self, now_ms: int) -> Liveness:
        """What is known of the consumer at *now_ms* (server ms)."""
        if self.gone_at is None:
            return Liveness("gone", "not registered", False, None)
        registered_alive = self.gone_at >= now_ms
        running = pid_running(self.host, self.pid, self.namespace)
        silent = max(0, now_ms - (self.heartbeat or 0)) / 1000
        lease = (self.lease_ms or 0) / 1000
        every = lease / BEATS_PER_LEASE
        if running is False:
            return Liveness("gone", "gone (pid not running)", registered_alive, False)
        if not registered_alive:
            return Liveness(
                "gone",
                f"gone (silent for {span_text(silent)}, past its "
                f"{span_text(lease)} lease)",
                False,
                running,
            )
        if every and silent > every * LATE_BEATS:
            return Liveness(
                "silent",
                f"silent for {span_text(silent)} (heartbeat due every "
                f"{span_text(every)})",
                True,
                running,
            )
        return Liveness("alive", "alive", True, running)


def consumer_from_row(
    row: Sequence[Any], now_ms: int, held: int | None = None, parts: Any = None
) -> ConsumerInfo:
    """One consumer of a ``consumers.lua`` or ``stats.lua`` reply, as seen at
    *now_ms* (server ms); *held*: the tasks it holds on the server (its
    recovery keys), else the count of its latest heartbeat stands; *parts*:
    the share its heartbeat registered (``"0-3,8"``), if read."""
    name, gone_at, host, pid, ns, hb, ttl, started, n, conc, *counts = row
    reported = _int(n)
    numbers = dict(zip(COUNTERS, (_int(c) for c in counts), strict=False))
    beat = Beat(
        _int(gone_at), _opt_int(hb), _opt_int(ttl), _opt_text(host), _int(pid), _ns(ns)
    )
    known = beat.liveness(now_ms)
    lease_ttl = _secs(ttl) or 0.0
    return ConsumerInfo(
        name=_text(name),
        host=_text(host or b""),
        pid=_int(pid),
        alive=known.state != "gone",
        last_heartbeat=_secs(hb) or 0.0,
        started=_secs(started) or 0.0,
        in_flight=reported if held is None else held,
        concurrency=_int(conc),
        lease_ttl=lease_ttl,
        stats=ConsumerStats(
            **{field: numbers.get(field, 0) for field in COUNTERS}, running=reported
        ),
        state=known.state,
        status=known.status,
        pid_running=known.pid_running,
        heartbeat_every=lease_ttl / BEATS_PER_LEASE,
        partitions=None if not isinstance(parts, bytes) else parse_share(_text(parts)),
    )


async def consumer_list(
    client: Client, parts: Partitions, limit: int
) -> list[ConsumerInfo]:
    """Registered consumers, live ones first (one ``consumers.lua`` call),
    each with the tasks it holds: its recovery key's size in partition 0
    (read by the same call), plus in each other partition (one pipeline
    of ``SCARD`` per partition, at once)."""
    reply = await CONSUMERS(client, parts.keys(0), (), (limit,))
    now_ms = _int(reply[0])
    rows = reply[1]
    names = [_text(row[0]) for row in rows]
    held = [max(0, _int(n)) for n in reply[2]] if len(reply) > 2 else [0] * len(rows)
    shares = reply[3] if len(reply) > 3 else [None] * len(rows)
    others = parts.all()[1:]
    if others and names:

        async def sizes(keys: QueueKeys) -> list[int]:
            async with client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.scard(keys.inflight(name))
                replies: list[Any] = await pipe.execute(raise_on_error=False)
            return [_opt_int(r) or 0 for r in replies]

        for more in await each_partition(others, sizes):
            held = [a + b for a, b in zip(held, more, strict=True)]
    return [
        consumer_from_row(row, now_ms, n, parts)
        for row, n, parts in zip(rows, held, shares, strict=True)
    ]


async def registry_beats(
    client: Client,
    keys: QueueKeys,
    names: Iterable[str],
    *,
    now_ms: int | None = None,
) -> tuple[dict[str, Beat], int | None]:
    """What the consumer registry (partition 0's, whatever partition *keys*
    is) says of each consumer in *names* and, given *now_ms*, how many
    consumers are alive then: one pipeline. A damaged registry key reads as
    "not registered" (``aiogroupq check`` reports it)."""
    wanted = sorted(set(names))
    if not wanted and now_ms is None:
        return {}, None
    registry = keys if keys.partition == 0 else QueueKeys(keys.queue)
    async with client.pipeline(transaction=False) as pipe:
        for name in wanted:
            pipe.zscore(registry.consumers, name)
            pipe.hmget(registry.consumer_info(name), *_BEAT_FIELDS)
        if now_ms is not None:
            pipe.zcount(registry.consumers, now_ms, "+inf")
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    beats = {
        name: _beat(replies[2 * i], replies[2 * i + 1]) for i, name in enumerate(wanted)
    }
    return beats, None if now_ms is None else _opt_int(replies[-1]) or 0


def _beat(score: Any, fields: Any) -> Beat:
    """A registry entry from its ``ZSCORE`` and ``HMGET`` replies (either an
    error, for a damaged key: then as far as it reads)."""
    gone_at = _opt_int(score)
    if gone_at is None:
        return Beat()
    if isinstance(fields, Exception) or not isinstance(fields, list):
        fields = [None] * len(_BEAT_FIELDS)
    hb, ttl, host, pid, ns = fields
    return Beat(
        gone_at, _opt_int(hb), _opt_int(ttl), _opt_text(host), _opt_int(pid), _ns(ns)
    )


#: what a liveness judgement reads of a registration (``_beat``'s order)
_BEAT_FIELDS: Final = ("hb", "ttl", "host", "pid", "ns")


def _ns(value: Any) -> str | None:
    """A registered pid namespace; ``None`` if none was (an older consumer)."""
    return _opt_text(value) or None


def discount_gone(alive: int, beats: Iterable[tuple[Beat, Liveness]]) -> int:
    """*alive* (the registry's count) less the consumers among *beats* it
    counts whose process is known gone."""
    return max(0, alive - sum(1 for _, k in beats if k.registered_alive and k.pid_gone))


# -- handing a dead consumer's tasks back ----------------------------------------


class ConsumerLiveError(ConsumerRunningError):
    """:func:`check_releasable` refused: the consumer may still run its
    tasks (a :class:`~aiogroupq.ConsumerRunningError`).

    :ivar name: the consumer's name
    :ivar status: what is known of it (``ConsumerInfo.status``)
    """

    def __init__(self, name: str, status: str, lease_left: float | None) -> None:
        if lease_left is None:
            ends = "its tasks are recovered when their leases end"
        elif lease_left > 0:
            ends = (
                f"its lease ends in {span_text(lease_left)} and the first claim "
                "after that recovers its tasks"
            )
        else:
            ends = "the next claim recovers its tasks"
        AiogroupqError.__init__(
            self,
            f"consumer {name!r} is {status}: its tasks are not handed back while "
            f"it may still run them; {ends} (run on the consumer's own host, a "
            "release works as soon as its process is gone)",
        )
        self.name = name
        self.status = status


async def check_releasable(client: Client, parts: Partitions, name: str) -> None:
    """Whether *name*'s tasks may be handed back now
    (``group_ops.release_consumer`` does it): read only.

    :raises ConsumerLiveError: while the registry counts it alive and its
        process is not known gone; or, not registered, while a process
        holds its name and is not known gone
    """
    keys0 = parts.keys(0)
    async with client.pipeline(transaction=False) as pipe:
        pipe.zscore(keys0.consumers, name)
        pipe.hmget(keys0.consumer_info(name), *_BEAT_FIELDS)
        pipe.get(keys0.consumer(name))
        score, fields, holder = await pipe.execute(raise_on_error=False)
    beat = _beat(score, fields)
    # The server's clock, as the registry's times are: a separate call, as a
    # cluster pipeline has no node for a keyless command.
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    registered = beat.gone_at is not None
    if not registered and isinstance(holder, bytes):
        # Not registered (a damaged registry key skips the registration),
        # but a process renews the hold on its name ("host:pid:token",
        # _work/identity.py), which lapses a lease after its last renewal:
        # as alive as a registered consumer, unless its process is gone.
        host, pid, _ = [*holder.decode(errors="replace").rsplit(":", 2), "", ""][:3]
        # (Its pid namespace is not in the hold: judged by its pid, as the
        # consumer's own name takeover judges a dead holder.)
        beat = Beat(now_ms, now_ms, None, host, _opt_int(pid or None))
    known = beat.liveness(now_ms)
    if not known.releasable:
        left = (beat.gone_at - now_ms) / 1000 if registered and beat.gone_at else None
        raise ConsumerLiveError(name, known.status, left)


def release_hint(name: str) -> str:
    """The command that hands *name*'s tasks back."""
    return f"aiogroupq release --consumer {shlex.quote(name)}"
