"""The BullMQ peer: skipped with a reason where it cannot run, and a
seconds-long run of its workloads where it can (Node.js, npm and the npm
registry, or an install already cached in ``benchmarks/.venvs/bullmq``).

Not collected by the normal suite; ``python -m pytest benchmarks/``. No
timing is asserted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import _node

ROOT = Path(__file__).resolve().parent.parent


def _bench(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None, timeout: float = 100
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "results.json"
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--retries", "0"]
    argv += ["--json", str(out), "--charts", str(tmp_path / "charts"), *extra]
    done = subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    print(done.stdout)
    print(done.stderr[-3000:], file=sys.stderr)
    assert done.returncode == 0, done.stderr[-4000:]
    return done, json.loads(out.read_text())


def test_bullmq_without_node_is_skipped_with_the_reason(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "BENCH_NODE_DIR": str(tmp_path / "n")}
    done, data = _bench(tmp_path, "--only", "bullmq", env=env)
    assert "bullmq skipped: node (Node.js) is not on PATH" in done.stderr
    assert data["meta"]["skipped"] == {"bullmq": "node (Node.js) is not on PATH"}
    assert data["results"] == {}
    assert "Skipped: bullmq: node (Node.js) is not on PATH" in done.stdout
    assert (tmp_path / "charts" / "throughput.svg").stat().st_size > 0


def test_bullmq_whose_install_fails_is_skipped_with_npm_s_words(
    tmp_path: Path,
) -> None:
    # A node that runs and an npm that cannot reach its registry, as offline.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in {
        "node": "echo v20.0.0-fake",
        "npm": "echo 'npm error code ENOTFOUND' >&2; exit 1",
    }.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "BENCH_NODE_DIR": str(tmp_path / "n"),
    }
    done, data = _bench(tmp_path, "--only", "bullmq", env=env)
    reason = data["meta"]["skipped"]["bullmq"]
    assert reason.startswith(
        f"npm install bullmq@{_node.BULLMQ_VERSION} failed (exit 1)"
    )
    assert "ENOTFOUND" in reason
    assert f"bullmq skipped: {reason}" in done.stderr
    assert data["results"] == {}


def _no_bullmq_here() -> str | None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node or npm is not on PATH"
    if _node.is_installed():
        return None
    return _node.registry_reachable(timeout=10)


@pytest.mark.timeout(900)
def test_quick_benchmark_of_bullmq_reports_every_figure(tmp_path: Path) -> None:
    why = _no_bullmq_here()
    if why is not None:
        pytest.skip(f"BullMQ cannot be installed here: {why}")
    # The first run installs BullMQ (npm, about a minute); later ones reuse it.
    done, data = _bench(tmp_path, "--only", "bullmq", timeout=800)
    assert data["meta"]["skipped"] == {}
    assert "| BullMQ |" in done.stdout
    r = data["results"]["bullmq"]

    def positive(value: object) -> bool:
        return isinstance(value, int | float) and value > 0 and math.isfinite(value)

    assert r["versions"]["bullmq"] == _node.BULLMQ_VERSION
    assert positive(r["enqueue_sequential_per_s"])
    assert positive(r["enqueue_batch"]["per_s"])
    assert positive(r["enqueue_batch"]["producer_cpu_us"])
    d = r["drain"]
    for value in (
        d["jobs_per_s"],
        d["steady_per_s"],
        d["worker_cpu_us"],
        d["server"]["redis_cpu_us"],
        d["server"]["commands"],
        d["enqueue"]["per_s"],
        d["enqueue"]["producer_cpu_us"],
        d["enqueue"]["server"]["redis_cpu_us"],
    ):
        assert positive(value)
    assert r["latency"]["pickup_ms"]["samples"] == 30
    assert r["latency"]["delayed_ms"]["samples"] == 20
    assert "grouped_drain" not in r  # BullMQ (open source) has no groups
    for name in ("throughput.svg", "cost.svg"):
        assert "BullMQ" in (tmp_path / "charts" / name).read_text()
