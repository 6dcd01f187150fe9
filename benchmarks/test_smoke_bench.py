"""A seconds-long run of the whole benchmark path for aiogroupq alone.

Not collected by the normal suite (its ``testpaths`` is ``tests/``); run it with
``python -m pytest benchmarks/test_smoke_bench.py``. It checks that every
workload runs and reports figures; it asserts no timing.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.anyio


async def test_quick_benchmark_of_aiogroupq_reports_every_figure(
    tmp_path: Path,
) -> None:
    out = tmp_path / "results.json"
    argv = [
        sys.executable,
        "-m",
        "benchmarks",
        "--quick",
        "--only",
        "aiogroupq",
        "--aiogroupq-here",
        "--retries",
        "0",
        "--json",
        str(out),
    ]
    with anyio.fail_after(100):
        done = await anyio.run_process(
            argv, cwd=ROOT, check=False, stderr=subprocess.STDOUT
        )
    text = done.stdout.decode(errors="replace")
    assert done.returncode == 0, text[-4000:]
    print(text)
    assert "| aiogroupq |" in text

    r = json.loads(out.read_text())["results"]["aiogroupq"]

    def positive(value: object) -> bool:
        return isinstance(value, int | float) and value > 0 and math.isfinite(value)

    assert positive(r["enqueue_sequential_per_s"])
    assert positive(r["enqueue_batch"]["per_s"])
    for key in ("drain", "grouped_drain", "backlog_drain"):
        d = r[key]
        assert positive(d["jobs_per_s"]), key
        assert positive(d["steady_per_s"]), key
        assert positive(d["worker_cpu_us"]), key
        assert positive(d["server"]["commands"]), key
    assert positive(r["drain"]["enqueue"]["per_s"])
    assert r["latency"]["pickup_ms"]["samples"] == 30
    assert r["latency"]["delayed_ms"]["samples"] == 20
    assert set(r["processes"]) == {"1", "2"}
    assert r["backlog_drain"]["backlog"] == 5_000
    for key in ("single", "batch"):  # the grouped-batch workload, both drains
        assert positive(r["grouped_batch"][key]["jobs_per_s"]), key
    assert "batch_size=50" in text


async def test_a_run_on_uvloop_runs_every_process_on_it(tmp_path: Path) -> None:
    pytest.importorskip("uvloop")
    out = tmp_path / "results.json"
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--only", "aiogroupq"]
    argv += ["--aiogroupq-here", "--retries", "0", "--workloads", "drain"]
    argv += ["--loop", "uvloop", "--json", str(out)]
    with anyio.fail_after(100):
        done = await anyio.run_process(
            argv, cwd=ROOT, check=False, stderr=subprocess.STDOUT
        )
    text = done.stdout.decode(errors="replace")
    assert done.returncode == 0, text[-4000:]
    assert "event loop uvloop" in text
    run = json.loads(out.read_text())
    assert run["meta"]["loop"] == "uvloop"
    assert run["results"]["aiogroupq"]["loop"] == "uvloop"
    assert run["results"]["aiogroupq"]["drain"]["jobs_per_s"] > 0
