"""``python -m benchmarks.script_ab`` and ``python -m benchmarks.lua_costs``
at a tiny size: their tables and every figure in them.

Not collected by the normal suite (its ``testpaths`` is ``tests/``); run it with
``python -m pytest benchmarks/test_smoke_levers.py``. It asserts no timing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import lua_costs
from benchmarks._smoke import ROOT, run_module


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| ---")
    ]


def test_script_ab_times_each_script_of_each_checkout() -> None:
    text = run_module(
        "benchmarks.script_ab", ".", ".", "-n", "40", "--lone", "3", "--rounds", "2"
    )
    rows = _rows(text)
    headers = [r for r in rows if r[0].endswith("µs per task")]
    assert [h[0] for h in headers] == [
        "ungrouped: µs per task",
        "own groups: µs per task",
    ]
    body = [r for r in rows if r not in headers]
    names = [r[0] for r in body]
    # ungrouped: the lone enqueue's own script too; each table ends with the sum
    ungrouped = ["claim", "enqueue", "enqueue_one", "finish", "all"]
    assert names == [*ungrouped, "claim", "enqueue", "finish", "all"]
    for row in body:
        assert len(row) == 4, row
        assert float(row[1]) > 0, row
        assert float(row[2]) > 0, row
        assert row[3].endswith("x"), row


def test_script_ab_refuses_a_directory_that_is_not_a_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.script_ab", str(tmp_path)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"is not a checkout of aiogroupq" in done.stderr


def test_lua_costs_prices_every_step() -> None:
    rows = _rows(run_module("benchmarks.lua_costs", "--reps", "200", "--rounds", "1"))
    assert rows[0] == ["step", "µs"]
    assert [r[0] for r in rows[1:]] == list(lua_costs.STEPS)
    # A step that calls the server costs it something; a restored step is a
    # difference of two loops, so only its being a figure is checked.
    for step, us in rows[1:]:
        if "redis.call" in lua_costs.STEPS[step] and step not in lua_costs.RESTORES:
            assert float(us) > 0, step
        else:
            float(us)
