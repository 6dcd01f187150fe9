"""The host names the dashboard answers to, and the origins its forms may
come from.

A browser sends the name it was given in ``Host``, whatever address that
name resolves to: a page of ``evil.example`` whose name is made to resolve
to 127.0.0.1 (DNS rebinding) reaches a dashboard on the loopback with
``Host: evil.example``, and, being same-origin with itself, reads its
answers and sends ``Origin: http://evil.example``. So every request's
``Host`` must be an allowed one (else 400), and a form's ``Origin`` must
name an allowed host too, rather than merely match the request's own
``Host``, which the sender chose.

An allowed host is written ``name``, ``name:port``, ``*.suffix`` (every
name under *suffix*, not *suffix* itself), an IPv6 address (``::1`` or
``[::1]:8000``), or ``*`` (any: for a host application that checks
``Host`` itself).
"""

from __future__ import annotations

__all__ = ("LOOPBACK", "AllowedHosts", "HostCheck")

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

#: the names of this machine's loopback: the library's default
LOOPBACK: Final = ("localhost", "127.0.0.1", "::1")
_DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}
#: a host name or an IP address (an IPv6 one without its brackets)
_NAME: Final = re.compile(r"[a-z0-9._:-]+")


@dataclass(frozen=True, slots=True)
class _Entry:
    """One allowed host: a name (``*`` any, ``.suffix`` a wildcard) and
    a port, or None for any."""

    name: str
    port: int | None

    def matches(self, name: str) -> bool:
        if self.name == "*":
            return True
        if self.name.startswith("."):
            return name.endswith(self.name)
        return name == self.name


def _split(text: str) -> tuple[str, int | None] | None:
    """``host[:port]`` as a lowercase name without IPv6 brackets or a
    trailing dot, and its port (None if not written); None if malformed."""
    try:
        parts = urlsplit(f"//{text}")
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    if not name or not _NAME.fullmatch(name):
        return None
    return name.rstrip("."), port


class AllowedHosts:
    """The hosts a dashboard answers to.

    :param hosts: the allowed hosts (see the module's docstring)
    :raises ConfigurationError: for an empty list or an entry that is no
        host name
    """

    def __init__(self, hosts: Iterable[str]) -> None:
        if isinstance(hosts, str):
            raise ConfigurationError(
                f"allowed_hosts must be a list of host names, got {hosts!r}"
            )
        entries = [_entry(host) for host in hosts]
        if not entries:
            raise ConfigurationError(
                "allowed_hosts is empty: the dashboard would refuse every "
                "request (give the names browsers reach it by, or ['*'])"
            )
        self.entries: tuple[_Entry, ...] = tuple(entries)

    def allows_host(self, host: str, scheme: str) -> bool:
        """Whether a request's ``Host`` header is allowed."""
        split = _split(host)
        if split is None:
            return False
        name, port = split
        if port is None:
            port = _DEFAULT_PORTS.get(scheme)
        return any(
            e.matches(name) and (e.port is None or e.port == port) for e in self.entries
        )

    def allows_origin(self, origin: str, host: str) -> bool:
        """Whether a form sent from *origin* (an ``Origin`` header, or the
        origin of a ``Referer``) to a request whose ``Host`` is *host* may
        act: its host is allowed, and on the port an entry names or, for
        an entry without a port, on the port the request was sent to (a
        page served by another port of an allowed name is another site)."""
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https"):
            return False
        split = _split(parts.netloc)
        sent_to = _split(host)
        if split is None or sent_to is None:
            return False
        name, written = split
        port = written if written is not None else _DEFAULT_PORTS[parts.scheme]
        for entry in self.entries:
            if entry.name == "*":
                # Any Host goes (the host application checks it): the form
                # must then come from the very host it was sent to.
                if split == sent_to:
                    return True
                continue
            if not entry.matches(name):
                continue
            if entry.port is not None and entry.port == port:
                return True
            # Browsers leave a default port out of both headers: compare them
            # as written, so a TLS proxy that forwards plain HTTP still passes.
            if entry.port is None and written == sent_to[1]:
                return True
        return False


def _entry(host: object) -> _Entry:
    if not isinstance(host, str) or not host.strip():
        raise ConfigurationError(
            f"an allowed host must be a host name such as 'dash.example.com', "
            f"got {host!r}"
        )
    text = host.strip().lower()
    if text == "*":
        return _Entry("*", None)
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"  # a bare IPv6 address
    wildcard = text.startswith("*.")
    split = _split(text[2:] if wildcard else text)
    if split is None:
        raise ConfigurationError(
            f"allowed host {host!r} is not a host name, host:port, *.domain or *"
        )
    name, port = split
    return _Entry(f".{name}" if wildcard else name, port)


class HostCheck:
    """Answers 400 to a request whose ``Host`` is not allowed, before any
    route, static file or authentication check sees it."""

    def __init__(self, app: ASGIApp, allowed: AllowedHosts) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = _header(scope["headers"], b"host")
        if host is not None and self.allowed.allows_host(host, scope["scheme"]):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        # Plain text: the sender is not a page of ours, and whatever the
        # Host names must not be echoed into HTML.
        body = b"Invalid host header: this dashboard does not answer to it\n"
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
