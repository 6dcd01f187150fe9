"""Own or borrow a ``redis.asyncio.Redis`` (or ``RedisCluster``) client, and
bound its calls (what a failure stands for among aiogroupq's errors is
``_store/failures.py``'s; what the servers must offer,
``_store/server_checks.py``'s).

A Redis Cluster is reached through a ``redis.asyncio.cluster.RedisCluster``:
it routes each command (a script call by its keys, which share one
partition's hash tag) to the node owning the slot, follows ``MOVED`` and
``ASK`` redirections and finds the new primary after a failover. A
``redis+cluster://`` URL makes one (``rediss+cluster://`` with TLS); it may
name several seed nodes, ``redis+cluster://h1:7000,h2:7000/``. A plain
client pointed at a cluster node could not follow redirections: it is
refused at entry with a :class:`~aiogroupq.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
import re
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeVar

import anyio
import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import FullJitterBackoff, NoBackoff

from ..errors import ConfigurationError
from . import failures as _failures, sentinel as _sentinel
from .failures import NOT_TRANSIENT

T = TypeVar("T")

Client = Redis | RedisCluster
"""A client of one server, or of a Redis Cluster."""

RedisLike = str | Redis | RedisCluster
"""A ``redis://``, ``redis+cluster://`` or ``redis+sentinel://`` URL (we
create and close the client) or a client to borrow."""

#: what a failing Redis call may raise: redis-py's errors, socket errors, and
#: a cluster client's own (no reachable node, a slot no node serves)
#: asyncio's own modules, whose frames say nothing of who called them
_ASYNCIO_DIR: Final = os.path.dirname(asyncio.__file__) + os.sep
REDIS_FAILURES: Final = (rexc.RedisError, OSError, rexc.RedisClusterException)

#: URL schemes of a Redis Cluster (seed nodes, comma-separated)
CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")

#: socket timeout of a consumer's own client: above the longest BLPOP it
#: issues (a producer's own client uses CALL_BUDGET)
OWN_SOCKET_TIMEOUT: Final = 10.0
#: connect timeout of clients we create
OWN_CONNECT_TIMEOUT: Final = 2.0
#: re-sends of an idempotent command after a connection error, with a random
#: backoff of at most 50 ms doubling to 1 s: no count, since
#: :data:`CALL_BUDGET` ends them. A count ran out on refused connections
#: (each refusal is instant) after about 1.3 s, before a restarting Redis
#: was back.
OWN_RETRIES: Final = -1
#: seconds one Redis round trip of a producer call (or of ``check_queue``,
#: or of a consumer's start-up checks) may take, re-sends and reconnects
#: included, before it fails with RedisUnavailableError: the time a caller
#: waits after Redis stops answering (down, frozen, cut off)
CALL_BUDGET: Final = 5.0
#: re-sends of a cluster client's own connection layer, each after a refresh
#: of the cluster's topology (our backoff and budget are _BoundedCluster's)
_CLUSTER_RESENDS: Final = 3


class BoundedRetry(Retry):
    """redis-py's asyncio :class:`~redis.asyncio.retry.Retry` within a time
    budget per call, and without re-sending after refused credentials.

    Every command, pipeline and connect of a client goes through
    :meth:`call_with_retry`, so the budget bounds each round trip, however the
    server fails: refusing connections (retried with backoff), or frozen
    (connections accepted by the kernel, no reply ever). When the budget runs
    out, the error names the server and the last failure retried.

    :param where: the server's ``host:port``, for the message when the
        budget runs out
    """

    def __init__(self, retries: int, *, budget: float, where: str = "Redis") -> None:
        super().__init__(FullJitterBackoff(cap=1.0, base=0.05), retries)
        self.budget = budget
        self.where = where

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        # redis-py's loop, written out here (its *is_retryable* and
        # *with_failure_count* came in 6.x): every command goes through it,
        # twice in redis-py 8 (its connect too), and its layers (two
        # closures, two more awaits) cost a lone enqueue more than its own.
        # asyncio's own timeout, not an anyio scope: an anyio scope cost a
        # producer's enqueue about a tenth of its CPU.
        _failures.forget_failures()
        self._backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        try:
            async with asyncio.timeout(self.budget) as budget:
                while True:
                    try:
                        return await do()
                    except self._supported_errors + _TRANSLATED as caught:
                        error = as_redis_error(caught)
                    if is_retryable is not None and not is_retryable(error):
                        raise error
                    failures += 1
                    cleanup = (
                        fail(error, failures) if with_failure_count else fail(error)
                    )
                    if inspect.isawaitable(cleanup):  # closes the connection: keep that
                        await cleanup
                    if isinstance(error, NOT_TRANSIENT):
                        raise error
                    _failures.note_failure(error)
                    if 0 <= self._retries < failures:
                        raise error
                    if (backoff := self._backoff.compute(failures)) > 0:
                        await asyncio.sleep(backoff)
        except TimeoutError:
            if not budget.expired():
                raise
        raise _failures.BudgetSpent(_failures.gave_up(self.where, self.budget))


#: what the socket itself raises, which redis-py's older connects let out
#: of its retry unretried (< 5.1: a refused connection's OSError)
_TRANSLATED: Final = (TimeoutError, OSError)


def as_redis_error(error: Exception, where: str | None = None) -> Exception:
    """*error* as redis-py raises it: the socket's own as its redis-py kind
    (worded as redis-py words it, with the server *where* it was met)."""
    translated: Exception
    if isinstance(error, TimeoutError):
        translated = rexc.TimeoutError(
            str(error) if where is None else f"Timeout reading from {where}"
        )
    elif isinstance(error, OSError):
        text = str(error) or type(error).__name__
        translated = rexc.ConnectionError(
            text if where is None else f"Error while talking to {where}: {text}"
        )
    else:
        return error  # redis-py's own
    translated.__cause__ = error
    return translated


def connection_kwargs(client: Client) -> dict[str, Any]:
    """The keyword arguments *client* makes its connections with."""
    if isinstance(client, RedisCluster):
        return client.get_connection_kwargs()
    return client.connection_pool.connection_kwargs


def check_borrowed(client: Client) -> None:
    """Refuse a client whose replies would be ``str``: envelopes are binary."""
    if connection_kwargs(client).get("decode_responses", False):
        raise ConfigurationError(
            "the Redis client was created with decode_responses=True; aiogroupq "
            "stores MessagePack and needs bytes: pass a client made with "
            "decode_responses=False (the default) or a URL"
        )


def sees_every_try(client: Client) -> bool:
    """Whether each connection *client* makes, and each failure it re-sends
    after, is reported to ``_store/failures.py``: a plain client that
    aiogroupq made from a URL (its handshake and its retry policy are ours)."""
    kwargs = connection_kwargs(client)
    return kwargs.get("redis_connect_func") is _handshake and isinstance(
        kwargs.get("retry"), BoundedRetry
    )


def socket_timeout(client: Client) -> float | None:
    """The client's socket timeout in seconds (``None``: unlimited)."""
    value = connection_kwargs(client).get("socket_timeout")
    return None if value is None else float(value)


def _inside_redis_py(exc: BaseException) -> bool:
    """Whether *exc* was raised by redis-py's own code, not by ours or the
    caller's: its innermost frame outside asyncio's transports is in the
    ``redis`` package. (Python 3.13's ``writelines`` on a connection that was
    lost fails inside asyncio itself, CPython issue 136234, called from
    redis-py.)"""
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        filename = frame.f_code.co_filename
        if filename.startswith(_ASYNCIO_DIR):
            continue
        return f"{os.sep}redis{os.sep}" in filename
    return False


@contextmanager
def cluster_glitches() -> Iterator[None]:
    """Raise an ``AttributeError`` or ``TypeError`` of redis-py's own code as
    the ConnectionError it stands for. While a cluster fails over, redis-py's
    cluster client may close a connection that another task is writing to,
    which then fails with ``'NoneType' object has no attribute
    'writelines'`` (redis-py issues 3546, 3835): a lost connection, which our
    loops retry, not a bug of the caller."""
    try:
        yield
    except (AttributeError, TypeError) as exc:
        if not _inside_redis_py(exc):
            raise
        raise rexc.ConnectionError(f"connection lost mid-call ({exc})") from exc


class _OwnCluster(RedisCluster):
    """The cluster client of a consumer that aiogroupq made from a URL."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        with cluster_glitches():
            return await super().execute_command(*args, **kwargs)


class _BoundedCluster(_OwnCluster):
    """A :class:`RedisCluster` whose every command is bounded by
    :data:`CALL_BUDGET`, re-sent with backoff while the cluster fails over
    (the cluster client itself re-sends at once, without waiting for the
    election of a new primary). Only for idempotent callers, as
    :class:`BoundedRetry` is."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        parent = super().execute_command
        return await _resend_within_budget(self, lambda: parent(*args, **dict(kwargs)))


async def resent_on_failover(client: Client, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, sent again with backoff within :data:`CALL_BUDGET` while a
    cluster client of ours (from a URL) meets a failover. For idempotent
    calls whose commands bypass :class:`_BoundedCluster`'s own re-sending
    (pipelines: the script and its ``WAIT``). Any other client: one try,
    its own retry policy applies."""
    if not isinstance(client, _BoundedCluster):
        return await call()
    return await _resend_within_budget(client, call)


#: what a cluster failing over answers (and redis-py < 5.1's own socket
#: errors on connecting: refused, reset, unreachable)
_FAILOVER_ERRORS: Final = (
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.ClusterDownError,
    rexc.TryAgainError,
    rexc.RedisClusterException,
    OSError,
)


async def _resend_within_budget(
    client: RedisCluster, call: Callable[[], Awaitable[T]]
) -> T:
    backoff = 0.05
    _failures.forget_failures()
    with anyio.move_on_after(CALL_BUDGET):
        while True:
            try:
                return await call()
            except NOT_TRANSIENT:
                raise
            except _FAILOVER_ERRORS as exc:
                _failures.note_failure(exc)
                await anyio.sleep(random.uniform(backoff / 2, backoff))
                backoff = min(backoff * 2, 1.0)
    raise _failures.BudgetSpent(_failures.gave_up(address_of(client), CALL_BUDGET))


async def _handshake(connection: AbstractConnection) -> None:
    """redis-py's handshake of a new connection, then a PING, so that a
    server that wants credentials we lack refuses them there, with NOAUTH
    (an AuthenticationError), whatever its version and redis-py's: redis-py 5
    sends nothing in its handshake that Redis 7.0 refuses (Redis 7.0 does
    not know CLIENT SETINFO), and Redis 7.0 answers a long command from a
    client without credentials with a protocol error, then hangs up. One
    round trip per new connection; PING is in every rule the docs give.

    From here on a request may reach the server: an enqueue that fails
    after this is an unknown outcome (``failures.outcome_of``)."""
    _failures.note_connected()
    try:
        await connection.on_connect()
        await connection.send_command("PING", check_health=False)
        await connection.read_response()
    except rexc.InvalidResponse as exc:
        where = {
            name: getattr(connection, name, None) for name in ("host", "port", "path")
        }
        raise _failures.NotRedisError(_address(where), exc) from exc


def _cluster_from_url(url: str, kwargs: dict[str, object], *, retry: bool) -> Client:
    """A cluster client for a ``redis+cluster://[auth@]h1:p1[,h2:p2...][/0][?..]``
    URL: the first node is the URL redis-py parses, the others seed nodes."""
    scheme, _, rest = url.partition("://")
    match = re.fullmatch(r"(?P<info>[^/?#]*@)?(?P<hosts>[^/?#]*)(?P<tail>.*)", rest)
    assert match is not None  # every string matches
    hosts = [h for h in match["hosts"].split(",") if h]
    if not hosts:
        raise ValueError("no host:port in the URL")
    seeds = []
    for host in hosts[1:]:
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ValueError(f"seed node {host!r} is not host:port")
        seeds.append(ClusterNode(name.strip("[]"), int(port)))
    base = "rediss" if scheme.startswith("rediss") else "redis"
    cls = _BoundedCluster if retry else _OwnCluster
    return cls.from_url(
        f"{base}://{match['info'] or ''}{hosts[0]}{match['tail']}",
        startup_nodes=seeds,
        **kwargs,
    )


def require_asyncio() -> None:
    """Refuse to start outside asyncio: redis.asyncio runs on nothing else, and
    under trio it would fail only at the first command, with a ``TypeError``.

    :raises ConfigurationError: if no asyncio event loop runs in this thread
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigurationError(
            "aiogroupq runs on asyncio; no asyncio event loop is running here "
            "(trio or another event loop?), and redis.asyncio supports no other: "
            "start it with asyncio.run() or anyio.run(..., backend='asyncio')"
        ) from None


# The user-info part of a URL: everything from after "scheme://" (or the
# start) to the LAST "@", so that a password holding "/", "@" or ":" (not
# percent-encoded, as in a malformed URL) is masked whole.
_USERINFO: Final = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)?(?P<info>.*)@")
_SECRET_QUERY: Final = re.compile(r"(?i)([?&](?:\w*password|pass|pwd)=)([^&#]*)")


def safe_url(url: str) -> str:
    """*url* with its password masked, for messages and logs.

    Works on malformed URLs too: whatever stands between ``scheme://`` and the
    last ``@`` is user info; only a user name before its first ``:`` is kept.
    A ``password=`` query parameter is masked as well.
    """
    text = _SECRET_QUERY.sub(r"\1***", str(url))
    match = _USERINFO.match(text)
    if match is None:
        return text
    user, colon, _ = match["info"].partition(":")
    if "/" in user:  # no "user:" before the "@": mask all of it
        user, colon = "", ":"
    masked = f"{user}:***" if colon else "***"
    return f"{match['head'] or ''}{masked}@{text[match.end() :]}"


def _redact(text: str, url: str) -> str:
    """*text* (an error from parsing *url*), or a placeholder if it quotes any
    piece of *url*'s user info (the parser may have cut the URL anywhere)."""
    match = _USERINFO.match(url)
    pieces = re.split(r"[:/@?#]", match["info"]) if match else []
    secrets = [*pieces, *(m[2] for m in _SECRET_QUERY.finditer(url))]
    if any(piece and piece in text for piece in secrets):
        return "the parser's message is withheld: it quotes the credentials"
    return text


@asynccontextmanager
async def open_client(redis: RedisLike, *, retry: bool) -> AsyncIterator[Client]:
    """Yield a usable client; close it afterwards only if we created it.

    :param retry: keep redis-py's automatic re-sending of commands after a
        connection error, within :data:`CALL_BUDGET` per round trip. Only for
        idempotent callers (enqueue, status); the consumer retries at its own
        layer, where it knows what is safe.
    :raises ConfigurationError: outside asyncio, or for an unusable client
    """
    require_asyncio()
    if isinstance(redis, Redis | RedisCluster):
        check_borrowed(redis)
        yield redis
        return
    client = new_client(redis, retry=retry)
    try:
        yield client
    finally:
        # Also when we are being cancelled: else the connection leaks.
        with anyio.CancelScope(shield=True):
            await client.aclose()


def new_client(redis: object, *, retry: bool) -> Client:
    """A client of our own for the URL *redis* (the caller closes it); it
    connects on its first command.

    :param retry: as for :func:`open_client`
    :raises ConfigurationError: for anything but a usable ``redis://``,
        ``redis+cluster://`` or ``redis+sentinel://`` URL (``_store/sentinel.py``)
    """
    if not isinstance(redis, str):
        raise ConfigurationError(
            f"expected a redis:// URL or a redis.asyncio.Redis client, got {redis!r}"
        )
    kwargs: dict[str, object] = {
        # redis-py before 8 reads the handshake of a new connection outside
        # the retry policy: only the socket timeout bounds that read.
        "socket_timeout": CALL_BUDGET if retry else OWN_SOCKET_TIMEOUT,
        "socket_connect_timeout": OWN_CONNECT_TIMEOUT,
    }
    client: Client
    try:
        if redis.partition("://")[0].lower() in CLUSTER_SCHEMES:
            # The cluster client re-sends after a connection error only to
            # find the new topology; our own retrying is _BoundedCluster's,
            # which CALL_BUDGET bounds (so a count here, not OWN_RETRIES'
            # "forever").
            kwargs["retry"] = Retry(NoBackoff(), _CLUSTER_RESENDS if retry else 0)
            client = _cluster_from_url(redis, kwargs, retry=retry)
        else:
            if retry:
                where = _url_address(redis)
                kwargs["retry"] = BoundedRetry(
                    OWN_RETRIES, budget=CALL_BUDGET, where=where
                )
                # redis-py 5 re-sends a command after a lost connection only
                # for the errors listed here (later versions: the retry's).
                # READONLY too: a primary demoted in a failover (a managed
                # endpoint still pointing at it) refused the write, applying
                # nothing (a replica applies no write of a client's, nor of
                # a script's), and the re-send reconnects, where the
                # endpoint now leads to the new primary.
                kwargs["retry_on_error"] = [
                    rexc.ConnectionError,
                    rexc.TimeoutError,
                    rexc.ReadOnlyError,
                ]
            else:
                kwargs["retry"] = Retry(NoBackoff(), 0)
            kwargs["redis_connect_func"] = _handshake
            if _sentinel.is_sentinel_url(redis):
                client = _sentinel.master_from_url(redis, kwargs)
            else:
                client = Redis.from_url(redis, **kwargs)  # type: ignore[arg-type]
    except (ValueError, TypeError, rexc.RedisClusterException) as exc:
        raise ConfigurationError(
            f"unusable Redis URL {safe_url(redis)!r}: {_redact(str(exc), redis)}"
        ) from None  # the parser's traceback would show the URL again
    return client


def address_of(client: Client) -> str:
    """Where *client* connects: ``host:port`` (or the socket path); a
    cluster client's seed nodes. Never the credentials."""
    if isinstance(client, RedisCluster):
        seeds = ",".join(client.nodes_manager.startup_nodes) or "?"
        return f"the Redis Cluster at {seeds}"
    return _sentinel.describe(client) or _address(connection_kwargs(client))


def _url_address(url: str) -> str:
    """``host:port`` (or the socket path) of a ``redis://`` URL."""
    if _sentinel.is_sentinel_url(url):
        return _sentinel.where(url)
    return _address(parse_url(url))


def _address(kwargs: Mapping[str, Any]) -> str:
    if path := kwargs.get("path"):
        return str(path)
    host = str(kwargs.get("host") or "localhost")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return f"{host}:{kwargs.get('port') or 6379}"


def node_of(client: Client, key: str) -> dict[str, Any]:
    """Keyword arguments that send a keyless command (``TIME``, ``SCAN``)
    to the server holding *key*: none for a single server."""
    if isinstance(client, RedisCluster):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}
