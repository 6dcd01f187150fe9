"""``python -m benchmarks.lua_costs``: what single steps of a script cost
the server, each run 100,000 times in a Lua loop.

For weighing a change to the scripts before building it: the server's time
per step (``INFO commandstats``' ``usec`` of the one ``EVAL`` running the
loop, over the loop's count), medians of ``--rounds``. The steps are the
ones a task's hot path takes (the fields claim and finish read and write,
as ``enqueue.lua`` stores them) beside the forms a packed layout would take
instead: the task's small fields as one MessagePack array (``cmsgpack``,
which Redis and Valkey ship) or one delimited string, and a group's counts
``k d w`` as one field. The server is ``$BENCH_SERVER``, else as the main
benchmark chooses, pinned to the first core. A step that deletes fields
runs with what puts them back (a delete of fields already gone costs
less), whose own loop is timed apart and subtracted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from typing import Any

#: a task hash as enqueue.lua writes it, and the same task packed (h)
_SETUP = (
    "redis.call('HSET', 't:x', 'e', string.rep('x', 41), 'm', '3', 'a', '0',"
    " 's', 'queued', 'dt', '1764000000000', 'i', '1764000000000 41 noop')"
    " redis.call('HSET', 't:y', 'e', string.rep('x', 41),"
    " 'h', cmsgpack.pack(H), 'i', '1764000000000 41 noop')"
    " redis.call('HSET', 'grp:x', 'k', 1, 'd', 0, 'w', 0, 'h:1', '@')"
    " redis.call('HSET', 'grp:y', 'n', '1 0 0', 'h:1', '@')"
)
#: the 15 small fields of a task, as the packed layout holds them
_H = (
    "local H = {'running', 1, 12345, 'consumer-1', 3, 1764000000000, false, false,"
    " false, false, false, false, false, false, false}"
)
_DELIMITED = "'running|1|12345|consumer-1|3|1764000000000|||||||||'"
_FIELD = "([^|]*)"

#: step -> the loop's body (i is the loop counter)
STEPS: dict[str, str] = {
    "claim reads 7 fields": "redis.call('HMGET', 't:x', 'e', 'g', 's', 'a', 'm', 'xp', 'dt')",
    "packed: claim reads 3 fields": "redis.call('HMGET', 't:y', 'e', 'g', 'h')",
    "claim writes 4 fields": (
        "redis.call('HSET', 't:x', 's', 'running', 'k', i, 'c', 'consumer-1', 'a', 1)"
    ),
    "packed: claim writes 1 field": "redis.call('HSET', 't:y', 'h', h)",
    "finish reads 9 fields": (
        "redis.call('HMGET', 't:x', 'k', 's', 'g', 'c', 'cx', 'w', 'bh', 'bm', 'bx')"
    ),
    "packed: finish reads 2 fields": "redis.call('HMGET', 't:y', 'h', 'g')",
    "finish deletes 5 fields": "redis.call('HDEL', 't:x', 'e', 'c', 'xp', 'dt', 'cl')",
    "packed: finish deletes 1 field": "redis.call('HDEL', 't:y', 'e')",
    "packed: cmsgpack.unpack of 15 fields, 9 empty": "local v = cmsgpack.unpack(h)",
    "packed: cmsgpack.pack of 15 fields, 9 empty": "local v = cmsgpack.pack(H)",
    "delimited: string.match of 15 fields, 9 empty": (
        f"local v = string.match({_DELIMITED}, '^{'|'.join([_FIELD] * 15)}$')"
    ),
    "delimited: concatenation of 15 fields, 9 empty": (
        "local v = H[1] .. '|' .. (H[2] + i) .. '|' .. (H[3] + i) .. '|' .. H[4] .. '|' .. H[5]"
        " .. '|' .. H[6] .. '||||||||||'"
    ),
    "group reads k, d, w, !": "redis.call('HMGET', 'grp:x', 'k', 'd', 'w', '!')",
    "packed group: reads n, !, parses": (
        "local n = redis.call('HMGET', 'grp:y', 'n', '!')"
        " local k, d, w = string.match(n[1], '^(%d+) (%d+) (%d+)$')"
        " k, d, w = tonumber(k), tonumber(d), tonumber(w)"
    ),
    "group writes k, d, w": "redis.call('HSET', 'grp:x', 'k', 1, 'd', 0, 'w', 0)",
    "packed group: writes n": "redis.call('HSET', 'grp:y', 'n', 1 .. ' ' .. 0 .. ' ' .. 0)",
    "an empty loop": "",
}
#: step -> what puts back the fields it deletes, timed in a loop of its own
#: and subtracted (a delete of fields already gone costs less)
RESTORES: dict[str, str] = {
    "finish deletes 5 fields": (
        "redis.call('HSET', 't:x', 'e', 'x', 'c', 'consumer-1', 'xp', 1, 'dt', 1, 'cl', 1)"
    ),
    "packed: finish deletes 1 field": "redis.call('HSET', 't:y', 'e', 'x')",
}


def measure(url: str, reps: int, rounds: int) -> dict[str, float]:
    """µs per step, medians of *rounds* (a step with a restore: the loop
    of both less the loop of the restore alone)."""
    from benchmarks.peers._harness import Resp

    resp = Resp(url)
    runs: dict[str, list[float]] = {step: [] for step in STEPS}
    try:
        for _ in range(rounds):
            for step, body in STEPS.items():
                restore = RESTORES.get(step, "")
                usec = _loop(resp, f"{restore} {body}", reps)
                if restore:
                    usec -= _loop(resp, restore, reps)
                runs[step].append(usec / reps)
    finally:
        resp.close()
    return {step: statistics.median(v) for step, v in runs.items()}


def _loop(resp: Any, body: str, reps: int) -> int:
    """The server's µs for *body* *reps* times in one EVAL, on fresh keys."""
    resp.call("FLUSHALL")
    script = f"{_H} local h = cmsgpack.pack(H) {_SETUP} for i = 1, {reps} do {body} end"
    resp.call("CONFIG", "RESETSTAT")
    resp.call("EVAL", script, 0)
    stat = resp.info("commandstats")["cmdstat_eval"]
    return int(dict(f.split("=", 1) for f in stat.split(","))["usec"])


def main(argv: list[str] | None = None) -> None:
    """Measure every step and print the table."""
    from benchmarks._report import table
    from benchmarks._runner import server_info, throwaway_server
    from benchmarks.floor import pin_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.lua_costs")
    parser.add_argument("--reps", type=int, default=100_000, help="each loop's count")
    parser.add_argument("--rounds", type=int, default=3, help="medians of these")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.rounds < 1:
        parser.error("--reps and --rounds take 1 or more")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(throwaway_server())
        pinned = pin_server(server.pid) if server.pid is not None else "not pinned"
        info = server_info(server.url)
        costs = measure(server.url, args.reps, args.rounds)
    print(
        f"{info['server']} {info['server_version']}, {pinned}; each step "
        f"{args.reps:,} times in one EVAL, medians of {args.rounds} rounds.\n"
    )
    print(table(["step", "µs"], [[step, f"{us:.3f}"] for step, us in costs.items()]))


if __name__ == "__main__":
    main(sys.argv[1:])
