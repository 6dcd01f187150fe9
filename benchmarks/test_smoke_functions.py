"""``python -m benchmarks.functions`` at a tiny size: the table of each way.

Not collected by the normal suite (its ``testpaths`` is ``tests/``); run it with
``python -m pytest benchmarks/test_smoke_functions.py``. It checks the shape of
the table and that every figure is there; it asserts no timing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import functions

ROOT = Path(__file__).resolve().parent.parent


def test_each_stage_has_both_ways_figures() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.functions", "-n", "200", "--lone", "10",
         "--rounds", "1"],
        cwd=ROOT,
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=200,
    )  # fmt: skip
    text = done.stdout.decode(errors="replace")
    assert done.returncode == 0, text[-4000:]
    rows = [line for line in text.splitlines() if line.startswith("| ")][2:]
    labels = [row.split("|")[1].strip() for row in rows]
    expected = [s.replace("_", " ") for s in functions.STAGES]
    assert labels == expected + [k.replace("_", " ") for k in functions.LIVES]
    for row in rows:
        cells = [c.strip() for c in row.split("|")[2:-1]]
        assert len(cells) == 6
        assert all(c and c != "—" for c in cells), row
