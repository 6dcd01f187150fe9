"""``python -m benchmarks.charts``: figures drawn from a hand-made results JSON.

Not collected by the normal suite; ``python -m pytest benchmarks/``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from benchmarks import charts

ROOT = Path(__file__).resolve().parent.parent


def _server(cpu: float, commands: float) -> dict[str, Any]:
    return {"tasks": 1000, "redis_cpu_us": cpu, "commands": commands}


def _drain(
    rate: float, worker: float, server: float, enq_rate: float
) -> dict[str, Any]:
    return {
        "jobs_per_s": rate,
        "steady_per_s": rate * 1.02,
        "worker_cpu_us": worker,
        "server": _server(server, 13.0),
        "enqueue": {
            "per_s": enq_rate,
            "producer_cpu_us": 108.0,
            "server": _server(48.5, 15.0),
        },
    }


def _run(revision: str, scale: float) -> dict[str, Any]:
    ours = {
        "label": "aiogroupq",
        "has_batch": True,
        "enqueue_sequential_per_s": 3970.0 * scale,
        "enqueue_batch": {"per_s": 39348.0 * scale, "producer_cpu_us": 17.1},
        "drain": {
            **_drain(20082.0 * scale, 49.1, 23.4, 9207.0),
            "stages": {"claim": 12.5, "finish": 9.0, "handler": 3.25},
        },
        "grouped_drain": _drain(16488.0 * scale, 56.4, 39.5, 8140.0),
        "latency": {"pickup_ms": {"p50": 1.98, "p99": 2.87, "max": 3.2}},
    }
    bullmq = {
        "label": "BullMQ",
        "has_batch": True,
        "enqueue_sequential_per_s": 3531.0,
        "enqueue_batch": {"per_s": 13853.0},
        "drain": _drain(15000.0, 255.0, 93.3, 9489.0),
    }
    # A peer that ran the enqueue workload only: rows with nothing to draw
    # are left out, not drawn as zero.
    arq = {"label": "arq", "enqueue_sequential_per_s": 2479.0}
    return {
        "meta": {
            "revision": revision,
            "server": "valkey",
            "server_version": "8.1.8",
            "drain": 20000,
            "machine": "2 cores",
            "date": "2026-11-26",
        },
        "results": {"aiogroupq": ours, "bullmq": bullmq, "arq": arq},
    }


def test_charts_are_drawn_from_two_runs_json(tmp_path: Path) -> None:
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps(_run("abc1234", 1.25)))
    old.write_text(json.dumps(_run("baf3732", 1.0)))
    out = tmp_path / "images"
    argv = [sys.executable, "-m", "benchmarks.charts", str(new), str(old)]
    done = subprocess.run(
        [*argv, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    written = {p.name: p.read_text() for p in out.iterdir()}
    assert set(written) == {"throughput.svg", "cost.svg", "compare.svg"}
    for name, svg in written.items():
        ET.fromstring(svg)  # well-formed
        print(f"{name}: {len(svg):,} bytes")
        assert svg.startswith("<svg ")
    texts = {
        name: [
            t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")
        ]
        for name, svg in written.items()
    }
    throughput = texts["throughput.svg"]
    assert "aiogroupq, own groups" in throughput
    assert "BullMQ" in throughput
    assert "25,102" in throughput  # 20,082 x 1.25, the new drain
    assert "2,479" in throughput  # arq's one figure
    cost = texts["cost.svg"]
    assert "48.5 + 23.4 = 71.9" in cost  # server: enqueue + drain stages
    assert "108 + 255 = 363" in cost  # BullMQ's producer + worker
    assert "stage: claim" in cost
    compare = texts["compare.svg"]
    assert "aiogroupq, baf3732" in compare
    assert "aiogroupq, abc1234" in compare
    assert "25,102 (+25.0%, better)" in compare
    assert "BullMQ, abc1234" in compare


def test_a_run_with_no_results_still_draws(tmp_path: Path) -> None:
    paths = charts.write_all({"meta": {}, "results": {}}, tmp_path)
    assert [p.name for p in paths] == ["throughput.svg", "cost.svg"]
    for path in paths:
        ET.fromstring(path.read_text())
