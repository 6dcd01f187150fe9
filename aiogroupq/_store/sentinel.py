"""Redis Sentinel: the ``redis+sentinel://`` URL and the client it makes.

A Sentinel deployment is a primary, its replicas, and sentinels that watch
them and promote a replica when the primary fails. A client asks the
sentinels where the primary is, and asks again whenever a connection fails
or the server it reaches says it is a replica now (redis-py's
``SentinelConnectionPool``): each role follows a failover by itself.

The URL names the sentinels, the service they monitor and the database::

    redis+sentinel://[user:password@]host:port[,host:port...]/<service>[/<db>][?options]

``rediss+sentinel://`` speaks TLS to the data nodes (and to the sentinels,
unless ``sentinel_ssl=no``). ``user:password@`` are the *data nodes'*
credentials, as ``Sentinel.master_for(..., username=, password=)`` takes
them; the sentinels' own are query options (``sentinel_username``,
``sentinel_password``), since sentinels and data nodes usually have
different ones. A host without a port is on 26379, the sentinels' own.
Every query option is listed in :data:`OPTIONS`; any other is refused.

Nothing here imports ``connection.py``: it builds the client with the
keyword arguments (retry policy, handshake, timeouts) that ``connection.py``
gives every client of its own.
"""

from __future__ import annotations

__all__ = (
    "DEFAULT_SENTINEL_PORT",
    "OPTIONS",
    "SCHEMES",
    "SentinelURL",
    "describe",
    "is_sentinel_url",
    "master_from_url",
    "parse",
    "where",
)

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff

#: URL schemes of a Sentinel deployment (TLS to the data nodes: ``rediss``)
SCHEMES: Final = ("redis+sentinel", "rediss+sentinel")
#: the port a sentinel listens on unless the URL says otherwise
DEFAULT_SENTINEL_PORT: Final = 26379
#: seconds a sentinel may take to connect or answer where the primary is,
#: unless ``sentinel_socket_timeout`` says otherwise: the sentinels are asked
#: one after another, so a frozen one must not eat a call's whole budget
SENTINEL_TIMEOUT: Final = 2.0

_TRUE: Final = frozenset({"1", "yes", "true", "on", "y"})
_FALSE: Final = frozenset({"0", "no", "false", "off", "n"})


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # NaN too
        raise ValueError("must be a number of seconds above 0")
    return value


def _count(text: str) -> int:
    if not text.isdigit():
        raise ValueError("must be a whole number, 0 or more")
    return int(text)


def _flag(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("must be yes or no")


def _text(text: str) -> str:
    return text


#: the query options a ``redis+sentinel://`` URL accepts, each with its
#: parser; ``sentinel_*`` and ``min_other_sentinels`` are for the sentinels,
#: the others for the connections to the data nodes (as in a ``redis://``
#: URL)
OPTIONS: Final[Mapping[str, Callable[[str], object]]] = {
    "sentinel_username": _text,
    "sentinel_password": _text,
    "sentinel_socket_timeout": _positive_float,
    "sentinel_ssl": _flag,
    "min_other_sentinels": _count,
    "socket_timeout": _positive_float,
    "socket_connect_timeout": _positive_float,
    "socket_keepalive": _flag,
    "health_check_interval": _count,
    "max_connections": _count,
    "client_name": _text,
    "ssl_cert_reqs": _text,
    "ssl_ca_certs": _text,
    "ssl_certfile": _text,
    "ssl_keyfile": _text,
    "ssl_check_hostname": _flag,
}
#: options that only mean something over TLS
_TLS_OPTIONS: Final = frozenset(name for name in OPTIONS if name.startswith("ssl_"))
#: options for the sentinels, not the data nodes
_SENTINEL_OPTIONS: Final = frozenset(
    {"sentinel_username", "sentinel_password", "sentinel_socket_timeout"}
    | {"sentinel_ssl", "min_other_sentinels"}
)

_SHAPE: Final = re.compile(
    r"(?:(?P<info>[^/?#]*)@)?(?P<hosts>[^/?#]*)(?P<path>/[^?#]*)?"
    r"(?:\?(?P<query>[^#]*))?(?:#.*)?",
    re.DOTALL,
)
_EXAMPLE: Final = "redis+sentinel://host1:26379,host2:26379/mymaster/0"


def is_sentinel_url(url: object) -> bool:
    """Whether *url* is a ``redis+sentinel://`` (or ``rediss+``) URL."""
    return isinstance(url, str) and url.partition("://")[0].lower() in SCHEMES


@dataclass(frozen=True, slots=True)
class SentinelURL:
    """A parsed ``redis+sentinel://`` URL.

    :ivar sentinels: the sentinels' ``(host, port)``, in the URL's order
    :ivar service: the name the sentinels monitor the primary under
    :ivar db: the database number
    :ivar node: keyword arguments of the connections to the data nodes
        (``Sentinel.master_for``'s): credentials, database, TLS, options
    :ivar sentinel: keyword arguments of the connections to the sentinels
    :ivar min_other_sentinels: redis-py's ``min_other_sentinels``: a
        sentinel that sees fewer peers is not believed
    """

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    node: dict[str, Any] = field(default_factory=dict)
    sentinel: dict[str, Any] = field(default_factory=dict)
    min_other_sentinels: int = 0

    def where(self) -> str:
        """Where the client goes, for messages: the service and the
        sentinels (never the credentials)."""
        return _where(self.service, self.sentinels)


def _where(service: str, sentinels: Iterable[tuple[object, object]]) -> str:
    addresses = ",".join(_joined(host, port) for host, port in sentinels)
    return f"the primary of Sentinel service {service!r} (sentinels {addresses})"


def _joined(host: object, port: object) -> str:
    text = str(host)
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


def parse(url: str) -> SentinelURL:
    """Parse a ``redis+sentinel://`` URL.

    :raises ValueError: with what is wrong and how to write it; the message
        never quotes the credentials
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"not a Sentinel URL: write {_EXAMPLE}")
    tls = scheme.lower().startswith("rediss")
    match = _SHAPE.fullmatch(rest)
    assert match is not None  # every string matches
    sentinels = tuple(_address(item) for item in match["hosts"].split(","))
    service, db = _service_and_db(match["path"] or "")
    options = _options(match["query"] or "", tls=tls)

    node: dict[str, Any] = {"db": db}
    if info := match["info"]:
        user, colon, password = info.partition(":")
        if user:
            node["username"] = unquote(user)
        if colon and password:
            node["password"] = unquote(password)
    if tls:
        node["ssl"] = True
    sentinel_ssl = bool(options.pop("sentinel_ssl", tls))
    timeout = options.pop("sentinel_socket_timeout", SENTINEL_TIMEOUT)
    sentinel: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        # One try per sentinel and question: the client's own retry policy
        # asks again, within its budget.
        "retry": Retry(NoBackoff(), 0),
    }
    if "sentinel_username" in options:
        sentinel["username"] = options.pop("sentinel_username")
    if "sentinel_password" in options:
        sentinel["password"] = options.pop("sentinel_password")
    min_others = options.pop("min_other_sentinels", 0)
    assert isinstance(min_others, int)
    for name, value in options.items():
        if name in _TLS_OPTIONS:
            if tls:
                node[name] = value
            if sentinel_ssl:
                sentinel[name] = value
        else:
            node[name] = value
    if sentinel_ssl:
        sentinel["ssl"] = True
    return SentinelURL(
        sentinels=sentinels,
        service=service,
        db=db,
        node=node,
        sentinel=sentinel,
        min_other_sentinels=min_others,
    )


def _address(item: str) -> tuple[str, int]:
    item = item.strip()
    if not item:
        raise ValueError(
            "a sentinel's address is missing (an empty one between commas, or "
            f"none at all): list the sentinels as host:port, as in {_EXAMPLE}"
        )
    if item.startswith("["):  # an IPv6 address
        host, bracket, tail = item[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise ValueError(f"sentinel address {item!r}: write [IPv6]:port")
        port = tail[1:] if tail else ""
    else:
        host, _, port = item.partition(":")
        if ":" in port:
            raise ValueError(
                f"sentinel address {item!r}: put an IPv6 address in brackets, "
                "[::1]:26379"
            )
    if not host:
        raise ValueError(f"sentinel address {item!r} has no host")
    if not port:
        return unquote(host), DEFAULT_SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"sentinel address {item!r}: the port must be a number from 1 to 65535"
        )
    return unquote(host), int(port)


def _service_and_db(path: str) -> tuple[str, int]:
    parts = path.strip("/").split("/") if path.strip("/") else []
    if not parts or not parts[0]:
        raise ValueError(
            "no Sentinel service name: after the sentinels' addresses, write "
            "the name they monitor the primary under (their 'sentinel monitor "
            f"<name> ...' line), as in {_EXAMPLE}"
        )
    if len(parts) > 2:
        raise ValueError(
            f"the path has {len(parts)} parts; it is /<service>[/<db>], as in "
            f"{_EXAMPLE}"
        )
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ValueError(
            f"the database {db!r} after the service name is not a number: "
            f"/<service>/<db>, as in {_EXAMPLE}"
        )
    return unquote(parts[0]), int(db)


def _options(query: str, *, tls: bool) -> dict[str, object]:
    options: dict[str, object] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        parser = OPTIONS.get(name)
        if parser is None:
            raise ValueError(
                f"unknown option {name!r} in the URL's query; a Sentinel URL "
                f"takes {', '.join(sorted(OPTIONS))}"
            )
        try:
            options[name] = parser(value)
        except ValueError as exc:
            # The parsers never quote the value: it may be a mistyped password.
            raise ValueError(f"option {name}: {exc}") from None
    tls_wanted = tls or bool(options.get("sentinel_ssl", False))
    if not tls_wanted and (given := sorted(_TLS_OPTIONS & options.keys())):
        raise ValueError(
            f"{', '.join(given)} only apply over TLS: use rediss+sentinel:// "
            "(or sentinel_ssl=yes for the sentinels alone)"
        )
    return options


def where(url: str) -> str:
    """Where a client of *url* goes, for messages (see
    :meth:`SentinelURL.where`); the URL's scheme if it does not parse."""
    try:
        return parse(url).where()
    except ValueError:
        return "the primary of a Redis Sentinel service"


class _FollowingConnection(SentinelManagedConnection):
    """A connection to a Sentinel service's primary that asks the sentinels
    where the primary is on every reconnect.

    redis-py's own asks only on a connect of the pool's; a command re-sent
    after a connection error (or after ``READONLY``, which it turns into
    one) reconnects on the same connection object, and redis-py 8 does that
    to the address it had: the demoted or dead primary, until the call's
    budget ran out (seen with a demoted primary answering ``READONLY`` to
    every re-send for 5 s)."""

    async def send_packed_command(
        self, command: Any, check_health: bool = True
    ) -> None:
        if not self.is_connected:
            await self.connect()  # type: ignore[no-untyped-call]
        await super().send_packed_command(command, check_health)


class _FollowingSSLConnection(_FollowingConnection, SentinelManagedSSLConnection):
    """:class:`_FollowingConnection` over TLS."""


class _OwnSentinelClient(Redis):
    """The client of a Sentinel service's primary that aiogroupq made from
    a URL: closing it also closes its connections to the sentinels (a
    ``master_for`` client leaves them to its ``Sentinel``)."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        pool = self.connection_pool
        try:
            await super().aclose(close_connection_pool)
        finally:
            # redis-py before 5.0.1 left the pool of master_for() open.
            await pool.disconnect()
            if isinstance(pool, SentinelConnectionPool):
                for sentinel in pool.sentinel_manager.sentinels:
                    await sentinel.aclose()


def master_from_url(url: str, kwargs: Mapping[str, Any]) -> Redis:
    """A client of the primary of the Sentinel service of *url*, made with
    *kwargs* (the URL's own options win, as in ``Redis.from_url``); it asks
    the sentinels where the primary is on connecting, and again after a
    connection error or a ``READONLY`` reply (redis-py's
    ``SentinelConnectionPool``). Closing it closes everything it opened.

    :raises ValueError: for a malformed URL (see :func:`parse`)
    """
    parsed = parse(url)
    manager = Sentinel(  # type: ignore[no-untyped-call]
        list(parsed.sentinels),
        min_other_sentinels=parsed.min_other_sentinels,
        sentinel_kwargs=parsed.sentinel,
    )
    node = {**kwargs, **parsed.node}
    tls = node.pop("ssl", False)
    client: Redis = manager.master_for(
        parsed.service,
        redis_class=_OwnSentinelClient,
        connection_class=_FollowingSSLConnection if tls else _FollowingConnection,
        **node,
    )
    return client


def describe(client: object) -> str | None:
    """Where *client* goes if it is a client of a Sentinel service's primary
    (``Sentinel.master_for``'s, ours or the caller's), else ``None``."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool):
        return None
    sentinels = [
        (
            s.connection_pool.connection_kwargs.get("host", "?"),
            s.connection_pool.connection_kwargs.get("port", "?"),
        )
        for s in pool.sentinel_manager.sentinels
    ]
    # The manager moves the sentinel that answered to the front: sorted,
    # so that the message does not change with that.
    return _where(str(pool.service_name), sorted(sentinels, key=str))
