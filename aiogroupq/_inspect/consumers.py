"""Reading the consumer registry for the views: the registered consumers
(one ``consumers.lua`` call), a consumer's row as :class:`ConsumerInfo`
(``stats.lua`` answers the same rows), and what the registry says of the
consumers of running tasks when a view reads another partition than the
registry's (partition 0 holds it; each other partition's is empty).
"""

from __future__ import annotations

__all__ = ("Beat", "consumer_from_row", "consumer_list", "registry_beats")

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._store.keys import QueueKeys
from .._store.registry import COUNTERS
from .._store.replies import text as _text
from .._store.scripts import CONSUMERS
from .raw import as_int as _int, opt_int as _opt_int, secs as _secs
from .views import ConsumerInfo, ConsumerStats

if TYPE_CHECKING:
    from .._store.connection import Client

#: a consumer as the registry has it: when it counts as gone and its latest
#: heartbeat (server ms), each ``None`` if it is not registered
Beat = tuple[int | None, int | None]


def consumer_from_row(row: Sequence[Any], now_ms: int) -> ConsumerInfo:
    """One consumer of a ``consumers.lua`` or ``stats.lua`` reply, as seen at
    *now_ms* (server ms)."""
    name, gone_at, host, pid, hb, ttl, started, n, conc, *counts = row
    in_flight = _int(n)
    numbers = dict(zip(COUNTERS, (_int(c) for c in counts), strict=False))
    return ConsumerInfo(
        name=_text(name),
        host=_text(host or b""),
        pid=_int(pid),
        alive=_int(gone_at) >= now_ms,
        last_heartbeat=_secs(hb) or 0.0,
        started=_secs(started) or 0.0,
        in_flight=in_flight,
        concurrency=_int(conc),
        lease_ttl=(_secs(ttl) or 0.0),
        stats=ConsumerStats(
            **{field: numbers.get(field, 0) for field in COUNTERS}, running=in_flight
        ),
    )


async def consumer_list(
    client: Client, keys: QueueKeys, limit: int
) -> list[ConsumerInfo]:
    """Registered consumers, live ones first (one ``consumers.lua`` call)."""
    reply = await CONSUMERS(client, keys, (), (limit,))
    now_ms = _int(reply[0])
    return [consumer_from_row(row, now_ms) for row in reply[1]]


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
            pipe.hget(registry.consumer_info(name), "hb")
        if now_ms is not None:
            pipe.zcount(registry.consumers, now_ms, "+inf")
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    beats = {
        name: (_opt_int(replies[2 * i]), _opt_int(replies[2 * i + 1]))
        for i, name in enumerate(wanted)
    }
    return beats, None if now_ms is None else _opt_int(replies[-1]) or 0
