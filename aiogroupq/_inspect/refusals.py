"""What an ACL refusal met by a view's script stands for: the commands the
Redis user lacks, found by trying them, never by reading a reply's wording.

A command refused inside a script does not always come back as a ``NOPERM``
reply: Redis 7.0 answers it with a plain ``ERR`` whose text varies between
versions (Valkey answers ``NOPERM``). The views' scripts only read, and need
only a few read commands beyond a worker's rule (docs/operations.md, "An ACL
user per queue"), so each of those is tried once, alone, on a key of the
queue that nothing uses: the ones Redis refuses (a ``NOPERM`` reply, which
a command sent outside a script always gets) are the ones to add. A command
every worker's rule grants, refused on that key, means the key pattern is
what is missing. When every try passes, the error was no refusal.
"""

from __future__ import annotations

__all__ = ("VIEW_READS", "Lacking", "lacking", "maybe_refusal", "view_refusal")

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import redis.exceptions as rexc

from ..errors import PermissionDeniedError

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.keys import QueueKeys

#: read-only commands the views' scripts and ``Admin``'s settings reads send
#: that a worker's rule may lack, with the arguments that follow the key in
#: a try (a command the rule grants passes its try)
VIEW_READS: Final[dict[str, tuple[str, ...]]] = {
    "hgetall": (),
    "lpos": ("-",),
    "pttl": (),
    "sscan": ("0",),
    "zcount": ("-inf", "+inf"),
    "zrevrange": ("0", "0"),
    "zrevrangebyscore": ("+inf", "-inf", "LIMIT", "0", "1"),
}
#: a command every worker's rule grants: refused on a queue's key, it is
#: the key pattern the user lacks
_GRANTED: Final = ("hget", ("-",))
#: the start of the error replies aiogroupq's own scripts make (a damaged
#: key, malformed arguments): never a refusal
_OURS: Final = "aiogroupq "


@dataclass(frozen=True, slots=True)
class Lacking:
    """What a user may not do on a queue: touch its keys at all, or run
    *commands* (lower case) of :data:`VIEW_READS`."""

    keys: bool
    commands: tuple[str, ...]


def maybe_refusal(exc: BaseException) -> bool:
    """Whether *exc* may be Redis refusing a command inside a script: a
    ``NOPERM`` reply, or a plain error reply (Redis 7.0's) that is not one of
    aiogroupq's own."""
    if isinstance(exc, rexc.NoPermissionError):
        return True
    return type(exc) is rexc.ResponseError and not str(exc).startswith(_OURS)


async def lacking(client: Client, keys: QueueKeys) -> Lacking:
    """Try each of :data:`VIEW_READS` on an unused key of *keys*' queue."""
    # Never written by any script: the tries read nothing of the queue's.
    unused = keys.prefix + "acl-probe"
    call: Any = client.execute_command
    name, rest = _GRANTED
    if not await _allowed(call, name, unused, rest):
        return Lacking(keys=True, commands=())
    missing = tuple(
        [
            name
            for name, rest in VIEW_READS.items()
            if not await _allowed(call, name, unused, rest)
        ]
    )
    return Lacking(keys=False, commands=missing)


async def view_refusal(
    client: Client, keys: QueueKeys, exc: BaseException
) -> PermissionDeniedError | None:
    """The refusal a view met (*exc*) as an error naming what the user
    lacks; ``None`` if *exc* is not one (or the tries find nothing refused:
    then *exc* stands as it was)."""
    if not maybe_refusal(exc):
        return None
    found = await lacking(client, keys)
    if found.keys:
        return PermissionDeniedError(
            f"NOPERM: the user may not touch the keys of this queue: its rule "
            f"needs ~{keys.prefix}*"
        )
    if not found.commands:
        return None
    return PermissionDeniedError(
        f"NOPERM: the user may not run "
        f"{', '.join(n.upper() for n in found.commands)}: the views (Admin.stats, "
        f"group_info, groups, task, consumers) need "
        f"{' '.join('+' + n for n in found.commands)} beyond a worker's rule, see "
        "'An ACL user per queue' in docs/operations.md"
    )


async def _allowed(call: Any, name: str, key: str, rest: tuple[str, ...]) -> bool:
    try:
        await call(name.upper(), key, *rest)
    except rexc.NoPermissionError:
        return False
    return True
