"""``python -m benchmarks.script_ab A B [...]``: the scripts of several
checkouts side by side, by the time the server spends in each call.

For a change to the Lua scripts whose effect is smaller than a run's spread
of server CPU (a microsecond or two per task on a 2-core machine, where the
spread between two runs of one commit is 5-10 %): every checkout's
functions library is loaded on one server, and each round runs the same
work through each checkout in turn (the order alternating from round to
round), in a child process whose ``aiogroupq`` is that checkout's. The
server logs every command's execution time (``SLOWLOG`` with a threshold of
0), which leaves out the network and the reply's write and keeps the
script's name (``FCALL aiogroupq_<hash>_<script>``), so each script's time
sums per checkout. Listing one checkout twice shows the spread.

The work of a round, ungrouped and then every task in a group of its own:
N tasks enqueued by 1,000, claimed by 20 and finished by 10 (about 100 in
flight), then ``--lone`` tasks each enqueued, claimed and finished alone.
A checkout's ``aiogroupq._store.scripts`` must have the calls this uses
(``enqueue``, ``claim``, ``finish``, ``NewTask``, ``Outcome``: 0323c45 and
later). The figures are the server's time per task, the log's own cost
included (about the same for every checkout: compare the ratios). The
server is ``$BENCH_SERVER``, else as the main benchmark chooses, pinned to
the first core.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_ENVELOPE = b"\x98" + b"x" * 40  # about a no-op task's envelope
#: tasks in flight at once, as a consumer with concurrency 100 keeps them
IN_FLIGHT = 100
VARIANTS = ("ungrouped", "own groups")


# A task's life as the package's own script calls make it, shared with
# ``benchmarks.functions``. They import nothing but ``aiogroupq``, and that
# only when called: a child runs them with another checkout first on the
# path, whose ``benchmarks`` may be older than this one's or absent.


def new_task(i: int, grouped: bool) -> Any:
    """Task *i*: a no-op task's envelope, in a group of its own or none."""
    from aiogroupq._store import scripts

    return scripts.NewTask(
        id=f"{i:x}",
        group=f"g{i}" if grouped else None,
        envelope=_ENVELOPE,
        delay_ms=0,
        max_attempts=3,
        dedup_key=None,
        identity="1764000000000 41 noop",
    )


async def claim_all(client: Any, keys: Any, n: int, k: int) -> list[Any]:
    """Claim *n* tasks by *k*, about 100 in flight."""
    from aiogroupq._store import scripts

    claimed: list[Any] = []
    while len(claimed) < n:
        calls = max(1, min(IN_FLIGHT // k, -(-(n - len(claimed)) // k)))
        replies = await asyncio.gather(
            *(
                scripts.claim(
                    client, keys, "c1", k=k, lease_ms=30_000, scan_limit=k + 64
                )
                for _ in range(calls)
            )
        )
        got = [t for r in replies for t in r.tasks]
        if not got:
            raise RuntimeError(f"{n - len(claimed)} tasks never became claimable")
        claimed += got
    return claimed


async def finish_all(client: Any, keys: Any, claimed: Sequence[Any], k: int) -> None:
    """Finish *claimed* as succeeded by *k*, about 100 in flight."""
    from aiogroupq._store import scripts

    outcomes = [scripts.Outcome(t.id, t.token, "ok") for t in claimed]
    chunks = [outcomes[i : i + k] for i in range(0, len(outcomes), k)]
    step = max(1, IN_FLIGHT // k)
    for i in range(0, len(chunks), step):
        codes = await asyncio.gather(
            *(
                scripts.finish(client, keys, c, retention_ms=60_000)
                for c in chunks[i : i + step]
            )
        )
        if any(code.name != "APPLIED" for cs in codes for code in cs):
            raise RuntimeError(f"a finish was refused: {codes}")


async def _child(url: str, grouped: bool, n: int, lone: int, first: int) -> None:
    """One round's work, through this interpreter's ``aiogroupq``."""
    import redis.asyncio

    from aiogroupq._store import scripts
    from aiogroupq._store.keys import QueueKeys

    client = redis.asyncio.Redis.from_url(url)
    keys = QueueKeys("script_ab")
    try:
        tasks = [new_task(first + i, grouped) for i in range(n)]
        for i in range(0, n, 1000):
            await scripts.enqueue(
                client, keys, tasks[i : i + 1000], dedup_window_ms=60_000
            )
        await finish_all(client, keys, await claim_all(client, keys, n, 20), 10)
        for i in range(lone):
            task = new_task(first + n + i, grouped)
            await scripts.enqueue(client, keys, [task], dedup_window_ms=60_000)
            await finish_all(client, keys, await claim_all(client, keys, 1, 1), 1)
    finally:
        await client.aclose()


def _script(command: list[Any]) -> str | None:
    """The script a logged command ran: the function's last part, or for
    ``EVALSHA`` the digest's head; None for any other command."""
    name = bytes(command[0]).decode().lower() if command else ""
    if name == "fcall":
        return bytes(command[1]).decode().split("_", 2)[-1]
    if name == "evalsha":
        return "evalsha " + bytes(command[1]).decode()[:8]
    return None


def measure(
    url: str, checkouts: list[Path], rounds: int, n: int, lone: int
) -> dict[tuple[str, str, int], float]:
    """µs of script time per task of a round (its N and its lone tasks
    together), by variant, script and checkout (its place in *checkouts*)."""
    from benchmarks.peers._harness import Resp

    resp = Resp(url)
    totals: dict[tuple[str, str, int], float] = collections.defaultdict(float)
    first = 0
    try:
        resp.call("CONFIG", "SET", "slowlog-log-slower-than", "0")
        resp.call("CONFIG", "SET", "slowlog-max-len", "1000000")
        for r in range(rounds):
            order = list(enumerate(checkouts))
            if r % 2:
                order.reverse()
            for variant in VARIANTS:
                for place, checkout in order:
                    # Each child on an empty keyspace (the libraries stay):
                    # the ended tasks of the ones before do not weigh on it.
                    resp.call("FLUSHALL")
                    resp.call("SLOWLOG", "RESET")
                    env = {**os.environ, "PYTHONPATH": str(checkout)}
                    child = [sys.executable, __file__, "--child", url, variant, str(n)]
                    child += [str(lone), str(first)]
                    subprocess.run(child, env=env, cwd=checkout, check=True)
                    first += n + lone
                    for entry in resp.call("SLOWLOG", "GET", "-1"):
                        script = _script(entry[3])
                        if script is not None:
                            totals[variant, script, place] += int(entry[2])
    finally:
        resp.close()
    per_task = rounds * (n + lone)
    return {key: value / per_task for key, value in totals.items()}


def report(figures: dict[tuple[str, str, int], float], checkouts: list[Path]) -> str:
    """Script x checkout, per variant, with each checkout's ratio to the first."""
    from benchmarks._report import table

    labels = [f"{i + 1}: {c.name}" for i, c in enumerate(checkouts)]
    out = []
    for variant in VARIANTS:
        scripts = sorted({s for v, s, _ in figures if v == variant and s != "ping"})
        rows = []
        for script in [*scripts, "all"]:
            names = scripts if script == "all" else [script]
            values = [
                sum(figures.get((variant, s, i), 0.0) for s in names)
                for i in range(len(checkouts))
            ]
            row = [script, *(f"{v:.2f}" for v in values)]
            row += [f"{v / values[0]:.3f}x" if values[0] else "—" for v in values[1:]]
            rows.append(row)
        headers = [
            f"{variant}: µs per task",
            *labels,
            *(f"{x} / 1" for x in labels[1:]),
        ]
        out.append(table(headers, rows))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Run the rounds and print the tables."""
    from benchmarks._runner import server_info, throwaway_server
    from benchmarks.floor import pin_server

    parser = argparse.ArgumentParser(prog="python -m benchmarks.script_ab")
    parser.add_argument(
        "checkouts", nargs="+", type=Path, help="directories holding aiogroupq/"
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("-n", "--tasks", type=int, default=2_000)
    parser.add_argument(
        "--lone", type=int, default=200, help="lone enqueues and pickups"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.tasks < 1 or args.lone < 0:
        parser.error("--rounds and --tasks take 1 or more, --lone 0 or more")
    checkouts = [c.resolve() for c in args.checkouts]
    for c in checkouts:
        if not (c / "aiogroupq" / "_store" / "scripts.py").is_file():
            parser.error(
                f"{c} is not a checkout of aiogroupq (no aiogroupq/_store/scripts.py)"
            )
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(throwaway_server())
        pinned = pin_server(server.pid) if server.pid is not None else "not pinned"
        info = server_info(server.url)
        figures = measure(server.url, checkouts, args.rounds, args.tasks, args.lone)
    print(
        f"{info['server']} {info['server_version']}, {pinned}; {args.rounds} rounds of "
        f"N = {args.tasks:,} (enqueue by 1,000, claim by 20, finish by 10) and "
        f"{args.lone:,} lone tasks; server time per task from SLOWLOG.\n"
    )
    for i, c in enumerate(checkouts):
        print(f"{i + 1}: {c}")
    print()
    print(report(figures, checkouts))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        url, variant, n, lone, first = sys.argv[2:7]
        asyncio.run(_child(url, variant == "own groups", int(n), int(lone), int(first)))
    else:
        main(sys.argv[1:])
