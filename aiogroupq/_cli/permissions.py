"""What an ACL refusal met by an operator command stands for, in one line
that names the commands the Redis user lacks.

A command refused inside a script does not always come back as a ``NOPERM``
reply (Redis 7.0 answers it with a plain ``ERR``), and the wording differs
between servers, so no reply text is read here: an error reply from a script
is tried out instead. The operator commands need only read-only commands
beyond a worker's rule (docs/operations.md, "An ACL user per queue"), so each
of those is tried once, alone, on a key of the queue that nothing uses: the
ones Redis refuses (a ``NOPERM`` reply) are the ones to add. A command every
worker's rule grants, refused on that key, means the key pattern is what is
missing. When every try passes, the error was not a refusal and stands as it
was.
"""

from __future__ import annotations

__all__ = ("OPERATOR_READS", "explain", "is_refusal")

from typing import TYPE_CHECKING, Final

import redis.exceptions as rexc

from .._inspect.refusals import VIEW_READS, lacking
from .._store.keys import QueueKeys
from ..errors import PermissionDeniedError

if TYPE_CHECKING:
    from .._store.connection import Client

#: read-only commands the views' scripts and ``Admin``'s settings reads send
#: that a worker's rule may lack (``_inspect/refusals.py`` tries them)
OPERATOR_READS: Final = VIEW_READS


def is_refusal(exc: BaseException) -> bool:
    """Whether *exc* may be Redis refusing the user a command or a key: a
    ``NOPERM`` reply, or an error reply from a script, which
    :func:`explain` tells apart by trying."""
    return isinstance(
        exc, PermissionDeniedError | rexc.NoPermissionError | rexc.ResponseError
    )


async def explain(client: Client, queue: str, exc: Exception) -> Exception:
    """The refusal *exc* as an error naming what the user lacks: the key
    pattern, or all the commands beyond a worker's rule it may not run; *exc*
    itself when the tries find nothing refused.

    :param client: the refused user's client
    :param queue: the queue the command was run on
    """
    keys = QueueKeys(queue)
    found = await lacking(client, keys)
    if found.keys:
        return PermissionDeniedError(
            f"the user may not touch the keys of queue {queue!r}: its rule "
            f"needs ~{keys.prefix}*"
        )
    if missing := found.commands:
        return PermissionDeniedError(
            f"the user may not run {', '.join(n.upper() for n in missing)}: the "
            f"operator commands need {' '.join('+' + n for n in missing)} beyond "
            "a worker's rule, see 'An ACL user per queue' in docs/operations.md"
        )
    if isinstance(exc, PermissionDeniedError):
        return exc
    if isinstance(exc, rexc.NoPermissionError):
        return PermissionDeniedError(str(exc))
    return exc  # every try passed: not a refusal
