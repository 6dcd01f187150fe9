"""The chaos journal: one atomic Redis call per event, on one logical clock.

Every handler start and end, and every fault the harness injects, is one
``journal.lua`` call that ``INCR``s a global clock and appends a line to a
list. The clock orders the events of every process on the Redis server's
timeline, with no reliance on local clocks; the line also carries the
server's ``TIME`` in ms, for the durations the tests print.

The journal is *fenced* (the oracle "O4" of RELIABILITY.md): a handler's line
carries its fencing token, and the script marks it ``fresh`` only if that
token still owns the task at that moment (the task is ``running`` with this
token and, for a grouped task, its slot mark in the group's hash ``grp:<g>``
is this token). A write of a
handler that lost its lease is kept but marked stale: it is how a user's
external store would refuse it when given ``current_task().fencing_token``.

The keys live outside the queue's ``{aiogroupq:<queue>}`` prefix, so the
queue's scripts never see them and the consistency check ignores them. They
sit in the same server as the queue: when it restarts with AOF, the journal
survives with it (``appendfsync always`` acknowledges nothing it would lose).

Line format, space-separated (``-`` for "none")::

    clock ms fresh kind  <fields...>
    run events  (kind S start, E end, F planned failure, C cancelled):
        ... pid name task_id seq group gseq attempt token
    fault marks (K kill -9, P SIGSTOP, Q SIGCONT, T SIGTERM, X exited,
                 RD redis down, RU redis up, D connections dropped,
                 FL function and script flush, N consumer started):
        ... pid arg
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Final

import anyio
import redis.asyncio
from redis.exceptions import RedisError

CLOCK: Final = "chaos:clock"
JOURNAL: Final = "chaos:journal"
RIDS: Final = "chaos:rids"

# KEYS: clock, journal, rids, task hash, group hash (or any key, unused)
# ARGV: record id (dedupes a re-sent call), token ("" for a fault mark),
#       1 if the task is grouped, the line after "clock ms fresh", task id
JOURNAL_LUA: Final = """
if redis.call('SADD', KEYS[3], ARGV[1]) == 0 then return -1 end
local clock = redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fresh = 1
if ARGV[2] ~= '' then
  local f = redis.call('HMGET', KEYS[4], 'k', 's')
  if f[1] ~= ARGV[2] or f[2] ~= 'running' then fresh = 0 end
  if ARGV[3] == '1' and redis.call('HGET', KEYS[5], 'h:' .. ARGV[5]) ~= ARGV[2] then
    fresh = 0
  end
end
redis.call('RPUSH', KEYS[2], clock .. ' ' .. ms .. ' ' .. fresh .. ' ' .. ARGV[4])
return clock
"""

_ids = itertools.count()


class JournalWriter:
    """Writes journal lines; a write is retried until it lands.

    A write re-sent after a lost reply is recognised by its record id and
    applied once.
    """

    def __init__(self, client: redis.asyncio.Redis, queue: str) -> None:
        self.client = client
        self.prefix = f"{{aiogroupq:{queue}}}:"
        self._script = client.register_script(JOURNAL_LUA)
        self._pid = os.getpid()

    async def write(
        self, line: str, *, task_id: str = "", group: str | None = None, token: str = ""
    ) -> int:
        """Append *line*; return its clock (-1 if an earlier try landed)."""
        rid = f"{self._pid}-{next(_ids)}"
        keys = [
            CLOCK,
            JOURNAL,
            RIDS,
            f"{self.prefix}t:{task_id}" if task_id else CLOCK,
            f"{self.prefix}grp:{group}" if group else CLOCK,
        ]
        args = [rid, token, "1" if group else "0", line, task_id]
        delay = 0.02
        while True:
            try:
                reply: Any = await self._script(keys=keys, args=args)
                return int(reply)
            except (RedisError, OSError):
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.2)

    async def mark(self, kind: str, pid: int | str = "-", arg: str = "-") -> int:
        """A fault mark from the harness."""
        return await self.write(f"{kind} {pid} {arg}")
