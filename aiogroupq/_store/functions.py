"""The package's scripts as one Redis Functions library, and which way a
client's calls take: ``FCALL`` of the library's functions, or ``EVALSHA``
of the scripts (``_store/lua.py``).

Why: a script defines its helpers (``_lua/lib/*.lua``, about a hundred
local functions and constants) again on every call, before its first line;
a library defines them once, when it is loaded. A lone call (an
``enqueue()``, an idle claim) pays that cost alone.

The library is made from the scripts themselves, not a copy:

- the helpers of ``_lua/lib``, once each, in the order the includes give;
  a helper's per-call state (the declarations after a ``--- @per-call``
  line, up to the first line that is not one: the prefix and the keys made
  from it, the clock, the settings, the counters, the groups) becomes the
  library's, declared bare and set afresh at the start of every call, as
  a script's run starts with it fresh; the fixed keys too;
- each script (``_store/lua.py`` hands them over, with the helpers) as one
  function, ``<library>_<script>``, with its shebang's flags, then its key
  checks and bindings, then its own body;
- ``<library>_ping``, which does nothing: a client's first call asks it
  whether the library is there and callable.

The library's name carries a hash of its source, so that two versions of
the package on one server (a rolling upgrade) each call their own. It is
part of the data set: saved, replicated and so present after a failover,
but gone after ``FUNCTION FLUSH`` or a restart without persistence.

Which way: a cluster client always takes EVALSHA (redis-py asks the
cluster for an ``FCALL``'s keys, a round trip more per call). Any other
client asks once, on its first script call: the ping answers, or the
library is loaded and the ping answers, and the client takes FCALL; an
``FCALL`` or a ``FUNCTION LOAD`` refused (an ACL without them, a replica)
and it takes EVALSHA, as before functions. A call by FCALL that fails with
an error no function of ours gives may have found the library gone: the
server's answer to a function that never exists tells; if it was gone the
library is loaded again, and the call, which did not run, is sent again.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from redis.typing import EncodableT

_PREFIX: Final = "aiogroupq_"
_PER_CALL: Final = re.compile(
    r"^--- @per-call\n((?:local (?!function\b)[^\n]*\n)+)", re.MULTILINE
)
_DECLARATION: Final = re.compile(r"^local ([\w, ]+?)(?: = (.*?))?\s*(?:--.*)?$")


@dataclass(frozen=True, slots=True)
class Script:
    """What the library needs of one script: its name, its shebang's flags,
    and its body with its key checks and bindings first."""

    name: str
    flags: tuple[str, ...]
    body: str


@dataclass(frozen=True, slots=True)
class Library:
    """The library: its name (``FUNCTION LOAD``'s) and its source."""

    name: str
    source: bytes

    def function(self, script: str) -> str:
        """The function that runs the script *script*."""
        return f"{self.name}_{script}"

    def fcall(
        self, script: str, all_keys: Sequence[str], argv: Sequence[EncodableT]
    ) -> list[EncodableT]:
        """The ``FCALL`` command of a call of *script*."""
        return ["FCALL", self.function(script), len(all_keys), *all_keys, *argv]


def _per_call(helpers: str) -> tuple[str, list[str]]:
    """*helpers* with their per-call state declared bare; and the
    assignments that set that state for a call."""
    reset: list[str] = []

    def bare(match: re.Match[str]) -> str:
        out = []
        for line in match.group(1).splitlines():
            declared = _DECLARATION.match(line)
            if declared is None:
                raise ValueError(f"_lua/lib: not a per-call declaration: {line!r}")
            names, value = declared.groups()
            out.append(f"local {names}")
            reset.append(f"{names} = {value or 'nil'}")
        return "\n".join(out) + "\n"

    return _PER_CALL.sub(bare, helpers), reset


def make(helpers: str, fixed: Sequence[str], scripts: Sequence[Script]) -> Library:
    """The library of *scripts*, with *helpers* (every lib, resolved) once
    and *fixed* (the fixed keys' Lua names) bound per call."""
    defined, reset = _per_call(helpers)
    # The state a call starts with: the prefix first, the rest is made from it.
    start = "\n  ".join(
        ["KEYS, ARGV = keys, args", *reset, *(f"{k} = nil" for k in fixed)]
    )
    parts = [
        "local KEYS, ARGV",
        "local " + ", ".join(fixed),
        defined,
        f"local function _start(keys, args)\n  {start}\nend",
        "local function ping() return 1 end",
    ]
    registered: list[tuple[str, str, tuple[str, ...]]] = [
        ("ping", "ping", ("no-writes", "allow-oom"))
    ]
    for script in scripts:
        # The library's fixed keys are assigned, not declared again.
        body = re.sub(r"^local (K_)", r"\1", script.body, flags=re.MULTILINE)
        parts.append(
            f"local function f_{script.name}(keys, args)\n_start(keys, args)\n"
            f"{body}\nend"
        )
        registered.append((script.name, f"f_{script.name}", script.flags))
    text = "\n".join(parts) + "\n"
    name = _PREFIX + hashlib.sha1(text.encode()).hexdigest()[:16]
    for short, callback, flags in registered:
        listed = ", ".join(f"'{f}'" for f in flags)
        text += (
            f"redis.register_function{{function_name='{name}_{short}', "
            f"callback={callback}, flags={{{listed}}}}}\n"
        )
    return Library(name, f"#!lua name={name}\n{text}".encode())


#: the way each client takes: True for FCALL
_WAYS: Final[weakref.WeakKeyDictionary[Any, bool]] = weakref.WeakKeyDictionary()


def known_way(client: Any) -> bool | None:
    """Whether *client* takes FCALL, if that is known yet."""
    if isinstance(client, RedisCluster):
        return False
    return _WAYS.get(client)


def settle(client: Any, *, fcall: bool) -> None:
    """Give *client* its way without asking the server (a measurement of
    one way, a test's stand-in client)."""
    _WAYS[client] = fcall


async def way(client: Any, library: Library) -> bool:
    """Whether *client*'s script calls take FCALL of *library* (else
    EVALSHA); asked once, on its first call."""
    known = known_way(client)
    if known is None:
        known = _WAYS[client] = await _usable(client, library)
    return known


async def _once(client: Any, *command: EncodableT) -> Any:
    """*command*'s reply, or the error it was answered with: in a pipeline of
    one, where an error reply is a reply, not a failure that the client's
    retry policy sends again (a replica's READONLY would be, for its budget)."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.execute_command(*command)
        (reply,) = await pipe.execute(raise_on_error=False)
    return reply


async def _usable(client: Any, library: Library) -> bool:
    """Whether the library answers *client*'s FCALL, once loaded if needed."""
    if await present(client, library):
        return True
    loaded = await _once(client, "FUNCTION", "LOAD", "REPLACE", library.source)
    # Refused: an ACL without FUNCTION, a replica, ...
    return not isinstance(loaded, Exception) and await present(client, library)


async def present(client: Any, library: Library) -> bool:
    """Whether the library is there and *client* may call it."""
    return not isinstance(
        await _once(client, "FCALL", library.function("ping"), 0), Exception
    )


async def recover(client: Any, reply: object, library: Library, script: str) -> bool:
    """After *reply* to a call of *script* by FCALL: whether it is an error
    that says the function was missing, so that it did not run (then the
    library is loaded again, where allowed, and the caller sends the call
    again).

    The server's own answer tells, asked for a function that never exists:
    an error worded as that one is a missing function (whatever the
    server's wording; another client may have loaded the library again
    since, so asking whether it is there now would not tell). An error
    that a function of ours gives, or a typed one (out of memory, an ACL, a
    replica, ...) stands: the function was there to give it.
    """
    if type(reply) is not ResponseError or str(reply).startswith("aiogroupq"):
        return False
    absent = library.function("absent")  # no script has that name
    missing = await _once(client, "FCALL", absent, 0)
    expected = str(missing).replace(absent, library.function(script))
    if type(missing) is not ResponseError or str(reply) != expected:
        return False
    _WAYS[client] = await _usable(client, library)
    return True
