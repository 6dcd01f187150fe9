"""``python -m benchmarks.floor`` at tiny sizes, alone and beside aiogroupq.

Not collected by the normal suite (its ``testpaths`` is ``tests/``); run it with
``python -m pytest benchmarks/test_smoke_floor.py``. It checks the shape of the
tables and that every figure is there; it asserts no timing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import floor
from benchmarks._report import floor_table
from benchmarks._smoke import run_module


def _run(*argv: str) -> str:
    return run_module(*argv, timeout=100)


def _rows(text: str, first_header: str) -> list[list[str]]:
    """The cells of the Markdown table whose first header is *first_header*."""
    lines = text.splitlines()
    heads = [
        i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |")
    ]
    assert heads, f"no table headed {first_header!r}"
    start = heads[0]
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and value >= 0 and math.isfinite(value)


@pytest.mark.parametrize("via", floor.VIAS)
def test_the_floor_reports_every_stage_of_both_variants(
    tmp_path: Path, via: str
) -> None:
    out = tmp_path / "floor.json"
    text = _run(
        "benchmarks.floor", "-n", "300", "--rounds", "2", "--via", via,
        "--json", str(out),
    )  # fmt: skip
    rows = _rows(text, "floor, per task")
    assert len(rows[0]) == 1 + 3 * len(floor.VARIANTS)
    assert [row[0] for row in rows[2:]] == [*floor.STAGES, "total"]
    assert all(len(row) == len(rows[0]) for row in rows)
    assert "—" not in {cell for row in rows[2:] for cell in row}

    run = json.loads(out.read_text())
    assert run["meta"]["server_version"]
    measured = run["floor"]
    assert measured["tasks"] == 300
    assert measured["via"] == via
    for variant in floor.VARIANTS:
        assert len(measured[variant]["rounds"]) == 2
        for stage in (*floor.STAGES, "total"):
            for figure in floor.FIGURES:
                assert _finite(measured[variant][stage][figure]), (variant, stage)
            # every stage runs at least one command a task inside its scripts
            assert measured[variant][stage]["commands"] >= 1, (variant, stage)


def test_a_run_with_floor_shows_aiogroupq_against_it(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    text = _run(
        "benchmarks", "--quick", "--only", "aiogroupq", "--aiogroupq-here",
        "--retries", "0", "--workloads", "drain,grouped", "--drain", "300",
        "--floor", "--json", str(out),
    )  # fmt: skip
    rows = _rows(text, "server CPU per task (µs)")
    assert [row[0] for row in rows[2:]] == [
        "enqueue",
        "drain: claim + finish",
        "task life",
    ]
    assert all(len(row) == 7 for row in rows)
    # aiogroupq's figure, the floor's and the ratio, in both variants
    assert "—" not in {cell for row in rows[2:] for cell in row}
    run = json.loads(out.read_text())
    assert run["meta"]["floor"]["tasks"] == 300


def test_the_floor_table_without_aiogroupq_shows_the_floor_alone() -> None:
    stage = {"redis_cpu_us": 2.0, "script_us": 1.5, "commands": 2.0}
    variant: dict[str, Any] = dict.fromkeys((*floor.STAGES, "total"), stage)
    text = floor_table({}, {"ungrouped": variant, "own_groups": variant})
    rows = _rows(text, "server CPU per task (µs)")
    assert rows[3][1:4] == ["—", "2.0 + 2.0 = 4.0", "—"]
