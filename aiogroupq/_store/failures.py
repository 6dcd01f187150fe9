"""What a Redis failure stands for among aiogroupq's errors, and which
failures no re-send can mend.

redis-py raises its own exceptions (and the socket's); a public method
raises :mod:`aiogroupq.errors` ones instead: a failure that outlived the
client's retries or its budget becomes
:class:`~aiogroupq.RedisUnavailableError`, refused credentials
:class:`~aiogroupq.AuthenticationError`, and so on
(:func:`as_aiogroupq_error`). What a script answers is
``_store/replies.py``'s.
"""

from __future__ import annotations

import errno
import functools
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Final, Literal, ParamSpec, TypeVar

import redis.exceptions as rexc
from redis.asyncio.sentinel import MasterNotFoundError

from ..errors import (
    AiogroupqError,
    AuthenticationError,
    ConfigurationError,
    OutcomeUnknownError,
    PermissionDeniedError,
    RedisUnavailableError,
)

P = ParamSpec("P")
T = TypeVar("T")

#: what redis-py counts as a ConnectionError and retries, though waiting does
#: not make a password right: never re-sent
NOT_TRANSIENT: Final[tuple[type[Exception], ...]] = tuple(
    cls
    for cls in (
        rexc.AuthenticationError,
        getattr(rexc, "AuthorizationError", None),
        getattr(rexc, "ExternalAuthProviderError", None),
    )
    if isinstance(cls, type)
)
_AUTH_ERRORS: Final = (*NOT_TRANSIENT, rexc.AuthenticationWrongNumberOfArgsError)


def as_aiogroupq_error(exc: BaseException) -> AiogroupqError | None:
    """The aiogroupq error a Redis failure stands for, or None if it is
    not one we know (or already ours)."""
    if isinstance(exc, AiogroupqError):
        return None
    if isinstance(exc, _AUTH_ERRORS):
        detail = str(exc) or type(exc).__name__
        if "already authenticated" in detail or "required" in detail:
            # NOAUTH, which redis-py's handshake can phrase confusingly
            detail = "the server needs a password and none was given"
        return AuthenticationError(detail)
    if isinstance(exc, rexc.NoPermissionError):
        # redis-py strips the reply's error code, which is what the docs and
        # an operator's search go by (the wording differs between servers).
        return PermissionDeniedError(f"NOPERM {exc}")
    if isinstance(exc, rexc.ResponseError) and "DB index" in str(exc):
        return ConfigurationError(
            f"Redis refused the database number in the URL ({exc}): use one "
            "below the server's 'databases' setting (16 by default)"
        )
    if isinstance(exc, rexc.MovedError | rexc.AskError) or (
        isinstance(exc, rexc.ResponseError) and str(exc).startswith("MOVED ")
    ):
        return ConfigurationError(NOT_A_CLUSTER_CLIENT)
    if isinstance(exc, rexc.RedisClusterException | rexc.ClusterError):
        return RedisUnavailableError(str(exc) or type(exc).__name__)
    if isinstance(exc, NotRedisError):
        # A new connection's handshake met another protocol (HTTP, TLS...)
        # before anything was sent: waiting will not change that, the URL
        # is wrong.
        return ConfigurationError(str(exc))
    if isinstance(exc, rexc.InvalidResponse):
        # A reply that cannot be read, mid-call: the connection is broken, and
        # what was sent may have been applied (an enqueue's outcome unknown).
        return RedisUnavailableError(
            f"the reply could not be read ({str(exc).rstrip('.')})"
        )
    # Not OSError at large: the builtin TimeoutError is one, and
    # Producer.result raises it for its own timeout.
    if isinstance(exc, rexc.ConnectionError | rexc.TimeoutError | ConnectionError):
        return RedisUnavailableError(str(exc) or type(exc).__name__)
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """*exc* and what it was raised from or during, each once."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def cause_of(exc: BaseException) -> str:
    """Why a connection or a round trip failed, in a few words read from the
    socket error behind *exc* (by its errno, not its message):
    ``connection refused``, ``connection reset by peer``, ``timed out``;
    else redis-py's own message."""
    for link in _chain(exc):
        if isinstance(link, TimeoutError | rexc.TimeoutError):
            return "timed out"
        if isinstance(link, socket.gaierror) and link.strerror:
            return f"cannot resolve the host name ({link.strerror})"
        if isinstance(link, OSError) and link.errno and link.errno > 0:
            # asyncio's own message ("Connect call failed ...") says less.
            text = os.strerror(link.errno)
            return text[:1].lower() + text[1:]
    text = (str(exc) or type(exc).__name__).rstrip(".")
    return text[:1].lower() + text[1:]


# Re-sending layers nest (a start-up check's budget around a client's
# BoundedRetry), and the outer budget may run out first: the failure the
# inner layer retried is kept here, per task, for the message of the one
# that gives up.
_LAST_FAILURE: ContextVar[BaseException | None] = ContextVar(
    "aiogroupq_last_failure", default=None
)


def forget_failures() -> None:
    """Start a bounded call: no failure met yet (see :func:`gave_up`)."""
    _LAST_FAILURE.set(None)


def note_failure(exc: BaseException) -> None:
    """Keep *exc*, a failure about to be retried, for :func:`gave_up` (an
    inner layer's :class:`BudgetSpent` keeps the cause it named), and for
    the :func:`outcome_of` around it."""
    if not isinstance(exc, BudgetSpent):
        _LAST_FAILURE.set(exc)
        if (outgoing := _OUTGOING.get()) is not None:
            outgoing.failures += 1
            outgoing.reached = outgoing.reached or not refused_connect(exc)


def note_connected() -> None:
    """A connection was made (its handshake begins): a request may reach
    the server from now on (see :func:`outcome_of`)."""
    if (outgoing := _OUTGOING.get()) is not None:
        outgoing.reached = True


#: errnos of a connection that was never made: the request was not sent
_NEVER_CONNECTED: Final = frozenset({errno.ECONNREFUSED, errno.ENOENT})


def refused_connect(exc: BaseException) -> bool:
    """Whether *exc* is a refusal to connect (by the socket error behind
    it: connection refused, no such socket file, an unknown host name), or
    no primary known to a Sentinel service's sentinels (a client of it
    asks them where to connect first): each happens before anything is
    sent."""
    return any(
        isinstance(link, socket.gaierror | MasterNotFoundError)
        or (isinstance(link, OSError) and link.errno in _NEVER_CONNECTED)
        for link in _chain(exc)
    )


def _budget_spent(exc: BaseException) -> bool:
    """Whether *exc* is, or wraps, a :class:`BudgetSpent` (redis-py 5 wraps
    an error raised while connecting in its own ``ConnectionError``)."""
    return any(isinstance(link, BudgetSpent) for link in _chain(exc))


class _Outgoing:
    """What one write met on its way (see :func:`outcome_of`)."""

    __slots__ = ("failures", "reached")

    def __init__(self) -> None:
        #: failures retried
        self.failures = 0
        #: a connection was made, or a retried failure was not a refusal
        #: to connect: the request may have reached the server
        self.reached = False


_OUTGOING: ContextVar[_Outgoing | None] = ContextVar("aiogroupq_outgoing", default=None)


def outcome_of(task_ids: Sequence[str], *, certain: Callable[[], bool]) -> _OutcomeOf:
    """Around an enqueue, whose re-sends are idempotent (a task whose id
    exists is left as it is): a failure after which its tasks may have been
    written is raised as :class:`~aiogroupq.OutcomeUnknownError`, never as a
    plain :class:`~aiogroupq.RedisUnavailableError` (which says nothing was).

    Nothing was written only when every try was refused before it could
    send: each failure retried was a refusal to connect, no connection was
    made (:func:`note_connected`), and the call ended on a refusal or on its
    budget while it kept being refused. Anything else (a reply that timed
    out or was cut, a server frozen or busy running the script, a budget
    spent waiting for a reply) may have followed a request that arrived.

    :param certain: says, once the call failed, whether every try was seen
        here: a plain client made from a URL reports its connections (its
        handshake is ours) and the failures it re-sends after (its retry
        policy is ``connection.BoundedRetry``). Otherwise (a borrowed client,
        whose re-sends are its own; a cluster client; the partitions of a
        partitioned queue, sent at once, of which some may have answered)
        every failure is an unknown outcome
    """
    return _OutcomeOf(task_ids, certain)


class _OutcomeOf:
    """:func:`outcome_of`'s context manager (a class: it is around every
    enqueue, where a generator's cost more)."""

    __slots__ = ("_certain", "_outgoing", "_task_ids", "_token")

    def __init__(self, task_ids: Sequence[str], certain: Callable[[], bool]) -> None:
        self._task_ids = task_ids
        self._certain = certain
        self._outgoing = _Outgoing()

    def __enter__(self) -> None:
        self._token = _OUTGOING.set(self._outgoing)

    def __exit__(
        self, kind: object, exc: BaseException | None, traceback: object
    ) -> Literal[False]:
        _OUTGOING.reset(self._token)
        if not isinstance(exc, Exception) or not _transport_failure(exc):
            return False
        detail = _detail(exc)
        never_sent = (
            not self._outgoing.reached
            and self._certain()
            and (
                refused_connect(exc)
                or busy(exc)  # the server's answer to this very request
                or (_budget_spent(exc) and self._outgoing.failures > 0)
            )
        )
        if never_sent and busy(exc):
            raise RedisUnavailableError(detail) from exc
        if never_sent:
            return False
        raise OutcomeUnknownError(list(self._task_ids), detail) from exc


def busy(exc: BaseException) -> bool:
    """Whether *exc* is a ``BUSY`` reply: the server is running a script
    past its time limit and runs nothing else meanwhile."""
    return isinstance(exc, rexc.ResponseError) and str(exc).startswith("BUSY ")


def _detail(exc: BaseException) -> str:
    if isinstance(exc, RedisUnavailableError):
        return exc.detail
    if busy(exc):
        return f"the server is busy running a script ({str(exc)[:80]})"
    ours = as_aiogroupq_error(exc)
    if isinstance(ours, RedisUnavailableError):
        return ours.detail
    return str(exc) or type(exc).__name__


def _transport_failure(exc: BaseException) -> bool:
    """Whether *exc* says the server did not answer (rather than answered
    with a refusal of its own, which writes nothing)."""
    if isinstance(exc, OutcomeUnknownError):
        return False
    if isinstance(exc, RedisUnavailableError) or busy(exc):
        return True
    return isinstance(as_aiogroupq_error(exc), RedisUnavailableError)


class BudgetSpent(rexc.TimeoutError):
    """A bounded call's time ran out; the message (:func:`gave_up`) says
    where and why. A redis-py TimeoutError, so that it becomes
    :class:`~aiogroupq.RedisUnavailableError` (not the builtin one, which
    ``Producer.result`` raises for its own timeout)."""


def gave_up(where: str, budget: float) -> str:
    """What a call whose *budget* ran out met at *where* (``host:port``):
    the cause of the last failure it retried, or that nothing answered."""
    last = _LAST_FAILURE.get()
    if last is None:
        return f"{where}: no reply within {budget:.1f} s"
    return f"{where}: {cause_of(last)}; gave up after {budget:.1f} s of retries"


class NotRedisError(rexc.InvalidResponse):
    """A new connection's handshake got an answer in another protocol than
    Redis's (an HTTP server, a TLS port reached without TLS): the message
    names the address."""

    def __init__(self, address: str, exc: BaseException) -> None:
        super().__init__(
            f"{address} did not answer as a Redis server "
            f"({str(exc).rstrip('.')}): is it the right host and port?"
        )


#: why a plain client of a cluster node is refused
NOT_A_CLUSTER_CLIENT: Final = (
    "the server is a node of a Redis Cluster, and a plain client cannot follow "
    "the cluster's redirections: connect with a redis+cluster://host:port URL "
    "or pass a redis.asyncio.cluster.RedisCluster client"
)


class _Translated:
    """:func:`translated_errors`'s context manager: stateless, one for all
    (around every call of the public API, where a generator's cost more)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: object, exc: BaseException | None, traceback: object
    ) -> Literal[False]:
        if isinstance(exc, Exception) and (ours := as_aiogroupq_error(exc)) is not None:
            raise ours from exc
        return False


_TRANSLATED: Final = _Translated()


def translated_errors() -> _Translated:
    """Raise what a Redis failure stands for (see :func:`as_aiogroupq_error`)."""
    return _TRANSLATED


def unavailable_as_error(
    method: Callable[P, Awaitable[T]],
) -> Callable[P, Awaitable[T]]:
    """Turn a Redis failure into its aiogroupq error: a connection failure
    that outlived the client's retries or its budget into
    :class:`~aiogroupq.RedisUnavailableError`, refused credentials into
    :class:`~aiogroupq.AuthenticationError`, and so on."""

    @functools.wraps(method)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        with _TRANSLATED:
            return await method(*args, **kwargs)

    return wrapper
