"""One connection held by a producer's send lane, spoken to directly.

A lone ``enqueue()`` is one script call, and through redis-py's client each
costs the caller about 120 µs of CPU: the pool's get and release, the
command packed argument by argument, a task for the socket write's timeout
and the retry wrappers, against some 40 µs for writing the packed command
and reading its reply. The producer's lane never has two calls on the wire
(``coalesce.py``), so it holds one connection of its own and sends each
call as one pre-packed write. Everything else stays redis-py's: the
connection is made by the client's connection class with the client's
settings (its handshake, TLS, credentials, socket timeouts), and each call
goes through the client's retry policy (:class:`~.connection.BoundedRetry`:
its budget, its re-sends after a lost connection, what it reports to
``failures.py``), as a command of the client would.

Only a plain client that aiogroupq made from a URL is held this way
(:meth:`HeldConnection.of`); a borrowed client, a cluster or a Sentinel
client keeps redis-py's path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.connection import (
    Connection,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)

from .connection import as_redis_error, sees_every_try

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .connection import Client

#: connection classes whose reading and writing we know (a Sentinel's,
#: which finds its primary on connect, is not among them)
_PLAIN: Final = (Connection, SSLConnection, UnixDomainSocketConnection)


def pack(args: Sequence[EncodableT]) -> bytes:
    """One command in the Redis protocol: bytes as they are, text as UTF-8,
    integers in decimal (the only kinds a script call of ours carries)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        # Exact types first: a lone enqueue packs two dozen arguments, and
        # isinstance's chain cost it more than the rest of the packing.
        kind = type(arg)
        value: bytes
        if kind is str:
            value = cast(str, arg).encode()
        elif kind is bytes:
            value = cast(bytes, arg)
        elif kind is int:
            value = b"%d" % cast(int, arg)
        else:
            value = _value(arg)
        out.append(b"$%d\r\n%s\r\n" % (len(value), value))
    return b"".join(out)


def _value(arg: EncodableT) -> bytes:
    # A subclass (an IntEnum, a str Enum) as its base type's value: its own
    # __str__ may say something else.
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return str.encode(arg)
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % int.__index__(arg)
    raise TypeError(f"cannot send {type(arg).__name__} {arg!r} to Redis")


class HeldConnection:
    """A connection of *client*'s kind, made with its settings, for calls
    that never overlap. Made on the first call; closed by :meth:`aclose`.

    A call whose caller is cancelled while its reply is awaited leaves the
    connection open, the reply *owed*: the next call reads and drops it
    before its own, so that a request already written is never overtaken by
    a later one (on one connection the server answers in order). A call
    that fails otherwise (a timeout, a lost connection, the client's budget
    spent) closes it: the next call opens a new one.
    """

    __slots__ = ("_connection", "_owed", "_timeout", "client")

    def __init__(self, client: Redis) -> None:
        #: the client it is made from: where the script calls' way is known
        #: (``_store/functions.py``) and asked
        self.client = client
        pool = client.connection_pool
        self._connection: Any = pool.connection_class(**pool.connection_kwargs)
        timeout = pool.connection_kwargs.get("socket_timeout")
        budget = getattr(self._connection.retry, "budget", None)
        # The client's budget bounds the whole call: a read timeout no
        # shorter than it could never fire, and costs each call a timer.
        self._timeout: float | None = (
            None
            if budget is not None and timeout is not None and timeout >= budget
            else timeout
        )
        #: replies written for and not read yet, the current call's included
        self._owed = 0

    @classmethod
    def of(cls, client: Client) -> HeldConnection | None:
        """A held connection for *client*, or None where its commands must
        keep going through redis-py (see the module's docstring)."""
        if not isinstance(client, Redis) or not sees_every_try(client):
            return None
        pool = client.connection_pool
        if type(pool) is not ConnectionPool or pool.connection_class not in _PLAIN:
            return None
        return cls(client)

    @property
    def owes(self) -> bool:
        """Whether a cancelled call's reply is still to be read."""
        return self._owed > 0

    async def call(self, packed: bytes) -> Any:
        """Send one packed command (:func:`pack`) and return its reply.

        :raises redis.exceptions.ResponseError: (or a subclass) for an error reply
        :raises redis.exceptions.ConnectionError: (or the retry policy's
            error) when the connection fails beyond the client's re-sends
        """
        try:
            return await self._connection.retry.call_with_retry(
                lambda: self._once(packed), self._failed
            )
        except Exception:
            # The budget spent while a reply was awaited (it cancels the
            # read, as a caller's cancel does): the server is not answering,
            # and a new connection is what the next call needs.
            if self._owed:
                await self._drop()
            raise

    async def settle(self) -> None:
        """Read the replies of cancelled calls (before a command is sent
        another way than this connection, which must not overtake them)."""
        if self._owed:
            with contextlib.suppress(rexc.ResponseError):  # theirs, not ours
                await self.call(b"")

    async def _once(self, packed: bytes) -> Any:
        connection = self._connection
        if connection.is_connected and (
            connection._reader.at_eof() or connection._writer.transport.is_closing()
        ):
            # Closed by the server while idle (a restart, its timeout): a
            # request written into it could not be told from one that
            # reached the server, so a new connection first, whose refusal
            # says for certain that nothing was sent.
            await self._drop()
        if not packed and not self._owed:
            return None  # a settle with nothing left to read (it was dropped)
        if not connection.is_connected:
            self._owed = 0
            try:
                await connection.connect()
            except BaseException:
                await self._drop()  # cut mid-handshake: of no use
                raise
        reply: Any = None
        try:
            if packed:
                # The reply, not the write, is what is waited for: a small
                # command fits the socket's buffer, a large one is drained.
                connection._writer.write(packed)
                self._owed += 1
                await connection._writer.drain()
            while self._owed:  # the earlier calls' replies first, then ours
                reply = await self._read()
                self._owed -= 1
        except asyncio.CancelledError:
            raise  # the reply stays owed, the connection open
        except BaseException as exc:
            # Cut mid-reply (a timeout, a lost socket): whatever the socket
            # still holds belongs to no later call.
            await self._drop()
            # Raised as redis-py raises them, for the retry policy.
            if isinstance(exc, Exception):
                raise as_redis_error(exc, connection._host_error()) from exc
            raise
        if isinstance(reply, rexc.ResponseError):
            raise reply
        return reply

    async def _read(self) -> Any:
        parser = self._connection._parser
        if self._timeout is None:
            return await parser.read_response()
        async with asyncio.timeout(self._timeout):
            return await parser.read_response()

    async def _drop(self) -> None:
        # Without waiting for the close: a peer that stopped answering (TLS
        # waits for its close_notify) must not hold a failing call past its
        # budget, and what the socket still holds is of no use to anyone.
        self._owed = 0
        await self._connection.disconnect(nowait=True)

    async def _failed(self, error: BaseException) -> None:
        # As redis-py's client does before re-sending: a new connection
        # (after READONLY, one that may lead to the new primary).
        del error
        await self._drop()

    async def aclose(self) -> None:
        """Read what cancelled calls are still owed (within the client's
        budget: as the lane's exit waits for a call on the wire), then close
        the connection (a later call opens it again)."""
        try:
            await self.settle()
        except Exception:  # noqa: BLE001 - not answering: closed at once
            await self._drop()
            return
        await self._connection.disconnect()
