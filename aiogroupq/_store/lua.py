"""A Lua script of ``_lua/`` as a :class:`Script`, run as its function in
the package's functions library (``FCALL``, see ``_store/functions.py``)
where the client takes it, else with EVALSHA (the scripts themselves are in
``_store/scripts.py``).

Each ``_lua/<name>.lua`` names the helpers it uses with ``--- @include "x"``
lines, resolved here from ``_lua/lib/x.lua`` (each helper once, after the
helpers it includes itself), and is read once at import. Its first line is a
``#!lua`` shebang: enqueue has no flags, so that under ``maxmemory`` Redis
refuses it before it writes anything; every other script carries
``allow-oom``, so that work already queued keeps draining. The SHA is computed
locally, so the hot path is a single EVALSHA. A ``NOSCRIPT`` reply
(``SCRIPT FLUSH``, a restart, a failover) means the script did not run; the
call is then sent again as EVAL with the whole source, which cannot answer
``NOSCRIPT`` however often the cache is flushed, and the script is loaded
again so that later calls go back to EVALSHA.

A :class:`Script` declares the queue's fixed keys it takes: its KEYS are
those, in that order, then the keys of the call. It is refused at import if
its source, helpers included, reads another fixed key or leaves one unread,
so that each script's KEYS are exactly the keys it uses. An error reply that
stands for a public error (a damaged key, Redis out of memory) is raised as
that error (:func:`~aiogroupq._store.replies.public_error`).

Every script builds most of its keys from the prefix in ``ARGV[1]``, which
nothing ties to the KEYS a call declares: a raw call declaring queue A's
keys with queue B's prefix would write into B, outside what it declared (and
on a cluster, outside the slot it was routed by). So each script starts by
checking that every key it is given is the prefix's: each fixed key must be
``ARGV[1] .. '<name>'``, and every other key must start with ``ARGV[1]``. Otherwise it
answers ``aiogroupq foreign-keys`` having done nothing, raised as
:class:`~aiogroupq.ConfigurationError`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Sequence
from importlib.resources import files
from typing import TYPE_CHECKING, Any, Final

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import AskError, NoScriptError, ResponseError, TryAgainError

from ..errors import AiogroupqError, ConfigurationError
from . import functions as _functions
from .connection import REDIS_FAILURES, cluster_glitches
from .held import pack
from .replies import public_error

if TYPE_CHECKING:
    from redis.typing import EncodableT

    from .connection import Client
    from .held import HeldConnection
    from .keys import QueueKeys


@functools.cache
def _read(path: str) -> str:
    # Cached: every script includes lib/base.lua and most of the others.
    return files("aiogroupq").joinpath("_lua", path).read_text(encoding="utf-8")


_INCLUDE: Final = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)


def _resolve(body: str, done: set[str]) -> str:
    """*body* with each ``--- @include "x"`` replaced by ``lib/x.lua`` (itself
    resolved first), or by nothing when an earlier include brought it in."""

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in done:
            return ""
        done.add(name)
        return _resolve(_read(f"lib/{name}.lua"), done)

    return _INCLUDE.sub(include, body)


#: the queue's keys a script may take as fixed keys (attributes of
#: :class:`~aiogroupq._store.keys.QueueKeys`); the Lua reads each as
#: ``K_<NAME>`` (see ``_lua/lib/base.lua``) and builds its other keys from
#: the prefix
FIXED_KEYS: Final = ("ready", "delayed", "leases", "wake", "fence", "dead", "consumers")

_FIXED_READ: Final = re.compile(
    r"\bK_(" + "|".join(k.upper() for k in FIXED_KEYS) + r")\b"
)
_COMMENT: Final = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)


#: the start of the error reply of a call whose KEYS are not those of the
#: prefix in its ARGV[1]
FOREIGN_KEYS: Final = "aiogroupq foreign-keys"
_FOREIGN_REPLY: Final = (
    f"return redis.error_reply('{FOREIGN_KEYS}: a key of KEYS is not one of the "
    "queue whose prefix is ARGV[1]; nothing was done')"
)


def _binding(names: Sequence[str]) -> str:
    """The Lua lines that check the call's keys against its prefix
    (``ARGV[1]``), then bind each declared fixed key to its ``K_<NAME>``."""
    # The call's own keys after the fixed ones (a task's hash, a consumer's
    # recovery key): each is the prefix and more.
    own = (
        f"for i = {len(names) + 1}, #KEYS do "
        "if string.sub(KEYS[i], 1, #ARGV[1]) ~= ARGV[1] then "
        f"{_FOREIGN_REPLY} end end\n"
    )
    if not names:
        return own
    fixed = " or ".join(
        f"KEYS[{i}] ~= ARGV[1] .. '{name}'" for i, name in enumerate(names, 1)
    )
    check = f"if {fixed} then {_FOREIGN_REPLY} end\n"
    local = ", ".join(f"K_{name.upper()}" for name in names)
    keys = ", ".join(f"KEYS[{i}]" for i in range(1, len(names) + 1))
    return f"{check}{own}local {local} = {keys}\n"


def _error_of(reply: ResponseError) -> AiogroupqError | None:
    """The public error an error reply of a script stands for, if any."""
    if str(reply).startswith(FOREIGN_KEYS):
        return ConfigurationError(
            f"a script refused its call: {reply}. Its KEYS must be keys of the "
            "queue (QueueKeys) whose prefix it is given"
        )
    return public_error(reply)


@functools.cache
def _fixed_read(path: str) -> frozenset[str]:
    """The fixed keys one Lua file reads (outside its comments), found once
    per file rather than once per script that includes it."""
    source = _COMMENT.sub("", _read(path))
    return frozenset(m.lower() for m in _FIXED_READ.findall(source))


def _check_keys(name: str, declared: Sequence[str], read: frozenset[str]) -> None:
    """Refuse a script whose source, helpers included (*read*: the fixed keys
    they read), reads a fixed key it does not declare (an error once that
    line runs) or declares one it never reads."""
    unknown = set(declared) - set(FIXED_KEYS)
    if unknown or len(set(declared)) != len(declared):
        raise ValueError(f"{name}.lua: bad fixed keys {declared!r}")
    if read != set(declared):
        raise ValueError(
            f"{name}.lua reads the fixed keys {sorted(read)} but declares "
            f"{sorted(declared)}"
        )


class Script:
    """A ``_lua/<name>.lua`` file with its includes, run by FCALL or EVALSHA.

    *keys* are the queue's fixed keys it takes (of :data:`FIXED_KEYS`), in
    the order of its KEYS; a call's own keys follow them.
    """

    __slots__ = ("function", "key_names", "name", "sha", "source")

    def __init__(self, name: str, *, keys: Sequence[str]) -> None:
        self.name = name
        self.key_names = tuple(keys)
        body = _read(f"{name}.lua")
        # The shebang (script flags such as allow-oom) must stay the first line.
        shebang, _, rest = (
            body.partition("\n") if body.startswith("#!") else ("", "", body)
        )
        included: set[str] = set()
        resolved = _resolve(rest, included)
        read = _fixed_read(f"{name}.lua").union(
            *(_fixed_read(f"lib/{lib}.lua") for lib in included)
        )
        _check_keys(name, self.key_names, read)
        # The bindings come first: every helper reads the locals they make.
        bound = _binding(self.key_names) + resolved
        flags = re.search(r"flags=(\S+)", shebang)
        #: what the functions library takes of it: its helpers are the library's
        self.function = _functions.Script(
            name,
            tuple(flags.group(1).split(",")) if flags else (),
            _binding(self.key_names) + _INCLUDE.sub("", rest),
        )
        self.source = (shebang + "\n" + bound).encode()
        self.sha = hashlib.sha1(self.source).hexdigest()
        _MADE[name] = self

    def all_keys(self, keys: QueueKeys, extra_keys: Sequence[str]) -> list[str]:
        """The KEYS of a call: the fixed keys declared, then *extra_keys*."""
        return [getattr(keys, name) for name in self.key_names] + list(extra_keys)

    def command(
        self,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        fcall: bool = False,
    ) -> list[EncodableT]:
        """The whole command of a call, for a pipeline: EVALSHA, or with
        *fcall* the library's function (``_store/functions.py``)."""
        all_keys = self.all_keys(keys, extra_keys)
        if fcall:
            return library().fcall(self.name, all_keys, (keys.prefix, *args))
        return ["EVALSHA", self.sha, len(all_keys), *all_keys, keys.prefix, *args]

    async def __call__(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        with _glitches(client):
            return await self._call(client, keys, extra_keys, args)

    async def _call(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        all_keys = self.all_keys(keys, extra_keys)
        argv = (keys.prefix, *args)
        try:
            ran, reply = await self._by_function(client, all_keys, argv)
            if ran:
                return reply
            try:
                return await client.evalsha(self.sha, len(all_keys), *all_keys, *argv)
            except NoScriptError:
                pass
            # Not run. Loading first and retrying EVALSHA can meet a second
            # flush in between (SCRIPT FLUSH on a timer does it); EVAL carries
            # the source, so it runs whatever the cache holds. The load keeps
            # the script cached for the next calls; EVAL alone may not (newer
            # Redis versions evict scripts that only EVAL brought in).
            await self.load(client, keys)
            source = self.source.decode()
            return await client.eval(source, len(all_keys), *all_keys, *argv)
        except ResponseError as exc:  # a refusal: nothing was written
            if (error := _error_of(exc)) is not None:
                raise error from exc
            raise

    async def _by_function(
        self,
        client: Client,
        all_keys: list[str],
        argv: tuple[EncodableT, ...],
        held: HeldConnection | None = None,
    ) -> tuple[bool, Any]:
        """The call as the library's function (on *client*, or on its *held*
        connection), where *client* takes FCALL: (True, its reply). (False,
        None) where it takes EVALSHA, or where the function was missing and
        did not run: the library is loaded again where allowed, and the
        call goes by EVALSHA this once, which a flush between the load and
        a retry cannot fail."""
        lib = library()
        if not await _functions.way(client, lib):
            return False, None
        command = lib.fcall(self.name, all_keys, argv)
        try:
            if held is None:
                return True, await client.execute_command(*command)
            return True, await held.call(pack(command))
        except ResponseError as exc:
            if not await _functions.recover(client, exc, lib, self.name):
                raise
        return False, None

    async def held(
        self,
        held: HeldConnection,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
    ) -> Any:
        """Run the script on a producer's held connection (``held.py``), as
        :meth:`__call__` runs it on a plain client: FCALL where the library
        answers; else EVALSHA, and after ``NOSCRIPT`` a load and EVAL with
        the whole source."""
        all_keys = self.all_keys(keys, extra_keys)
        argv = (keys.prefix, *args)
        tail = (len(all_keys), *all_keys, *argv)
        try:
            ran, reply = await self._by_function(held.client, all_keys, argv, held)
            if ran:
                return reply
            try:
                return await held.call(pack(("EVALSHA", self.sha, *tail)))
            except NoScriptError:
                pass
            await held.call(pack(("SCRIPT", "LOAD", self.source)))
            return await held.call(pack(("EVAL", self.source, *tail)))
        except ResponseError as exc:  # a refusal: nothing was written
            if (error := _error_of(exc)) is not None:
                raise error from exc
            raise

    async def load(self, client: Client, keys: QueueKeys) -> None:
        """``SCRIPT LOAD`` on the server of *keys*: with a cluster, the node
        owning their slot only (a load sent to every primary would fail
        while one of them is down; the EVAL that follows runs anyway)."""
        if not isinstance(client, RedisCluster):
            await client.script_load(self.source)
            return
        with contextlib.suppress(*REDIS_FAILURES):
            node = _node(client, keys)
            await client.execute_command("SCRIPT LOAD", self.source, target_nodes=node)

    async def behind(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        first: Sequence[EncodableT],
    ) -> tuple[Any, Any]:
        """Send the command *first*, then the script, in one pipeline on one
        connection of a plain (not cluster) client: the server runs the
        script the moment *first* returns, a blocking pop's wake-up
        included, with no round trip back to us in between. Return *first*'s
        reply (the exception, if it failed) and the script's.

        After ``NOSCRIPT``, or a function missing (not run), the script is
        sent again as :meth:`__call__` sends it."""
        assert not isinstance(client, RedisCluster)
        fcall = await _functions.way(client, library())
        async with client.pipeline(transaction=False) as pipe:
            pipe.execute_command(*first)
            pipe.execute_command(*self.command(keys, extra_keys, args, fcall=fcall))
            before, reply = await pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError) or (
            fcall and await _functions.recover(client, reply, library(), self.name)
        ):
            return before, await self._call(client, keys, extra_keys, args)
        if isinstance(reply, ResponseError) and (error := _error_of(reply)) is not None:
            raise error from reply
        if isinstance(reply, Exception):
            raise reply
        return before, reply

    async def replicated(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        """Run the script, then ``WAIT replicas timeout_ms`` on the same
        connection; return its reply and how many replicas acknowledged its
        writes (and every write before them: replication is one ordered
        stream). It is sent again only after ``NOSCRIPT`` or a cluster
        redirection, which mean it did not run."""
        with _glitches(client):
            return await self._replicated(
                client,
                keys,
                extra_keys,
                args,
                replicas=replicas,
                timeout_ms=timeout_ms,
            )

    async def _replicated(
        self,
        client: Client,
        keys: QueueKeys,
        extra_keys: Sequence[str],
        args: Sequence[EncodableT],
        *,
        replicas: int,
        timeout_ms: int,
    ) -> tuple[Any, int]:
        reply: Any = None
        for _ in range(5):
            fcall = await _functions.way(client, library())
            command = self.command(keys, extra_keys, args, fcall=fcall)
            async with client.pipeline(transaction=False) as pipe:
                pipe.execute_command(*command)
                if isinstance(client, RedisCluster):
                    node = _node(client, keys)
                    pipe.execute_command(
                        "WAIT", replicas, timeout_ms, target_nodes=node
                    )
                    reply, acked = await pipe.execute(  # type: ignore[call-arg]
                        raise_on_error=False, allow_redirections=False
                    )
                else:
                    pipe.execute_command("WAIT", replicas, timeout_ms)
                    reply, acked = await pipe.execute(raise_on_error=False)
            if isinstance(reply, NoScriptError):
                await self.load(client, keys)
                continue
            if fcall and await _functions.recover(client, reply, library(), self.name):
                continue
            if isinstance(client, RedisCluster) and isinstance(
                reply, AskError | TryAgainError
            ):
                # Not run: a keyed read follows the redirection, which
                # updates the client's slot map; then send both again.
                await client.hget(keys.conf, "parts")
                continue
            break
        if isinstance(reply, ResponseError) and (error := _error_of(reply)) is not None:
            raise error from reply
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acked, Exception):
            raise acked
        return reply, int(acked)


#: every Script made, by name: the functions library's scripts
_MADE: Final[dict[str, Script]] = {}


@functools.cache
def library() -> _functions.Library:
    """Every :class:`Script` made (the catalogue in ``_store/scripts.py``)
    as one functions library, with every helper of ``_lua/lib`` once."""
    lib = files("aiogroupq").joinpath("_lua", "lib")
    names = sorted(
        p.name.removesuffix(".lua") for p in lib.iterdir() if p.name.endswith(".lua")
    )
    helpers = _resolve("\n".join(f'--- @include "{n}"' for n in names), set())
    fixed = [f"K_{name.upper()}" for name in FIXED_KEYS]
    return _functions.make(helpers, fixed, [s.function for s in _MADE.values()])


def _node(client: RedisCluster, keys: QueueKeys) -> Any:
    # The node of the partition's slot: its prefix holds the hash tag every
    # key of the partition shares, whichever keys a script declares.
    return client.get_node_from_key(keys.prefix)


def _glitches(client: Client) -> contextlib.AbstractContextManager[None]:
    # Only a cluster client has the failover glitch; on a plain client an
    # AttributeError from redis-py stays what it is.
    if isinstance(client, RedisCluster):
        return cluster_glitches()
    return contextlib.nullcontext()
