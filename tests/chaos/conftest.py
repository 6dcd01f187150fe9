"""Chaos fixtures: the figures each chaos test reports, printed as one JSON
line per test and as a table at the end of the session.

``AIOGROUPQ_CHAOS_REPORT=path`` also appends the JSON lines to *path*.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ._harness import Result

_RESULTS: list[dict[str, Any]] = []


@pytest.fixture
def chaos_report() -> Callable[[Result], None]:
    """Call with a :class:`Result` to print and keep its figures."""

    def add(result: Result) -> None:
        figures = result.figures()
        _RESULTS.append(figures)
        line = json.dumps(figures, sort_keys=True)
        print(line)  # noqa: T201 - the figures are the point
        print(result.summary())  # noqa: T201
        if path := os.environ.get("AIOGROUPQ_CHAOS_REPORT"):
            with open(path, "a") as out:
                out.write(line + "\n")

    return add


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def table(results: list[dict[str, Any]]) -> list[str]:
    """The figures per fault type as a Markdown table."""
    head = (
        "| fault | tasks enqueued | faults injected | tasks lost | order violations"
        " | overlaps in a group (fenced) | duplicate runs not explained by a crash"
        " | re-runs explained by a fault | recovery after kill p50 / max (s) | s |"
    )
    rows = [head, "|" + "---|" * 10]
    for f in results:
        faults = {
            k: v for k, v in f["faults"].items() if k not in ("N", "X", "Q", "RU")
        }
        rows.append(
            f"| {f['fault']} | {f['enqueued']:,} | "
            + ", ".join(f"{k} {v}" for k, v in sorted(faults.items()))
            + f" | {f['lost']} | {f['order_violations']} | {f['overlaps']} "
            f"({sum(f['fenced_overlaps'].values())}) | {f['duplicates_unexplained']} | "
            f"{sum(f['reruns_explained'].values())} | "
            f"{_fmt(f['recovery_p50_s'])} / {_fmt(f['recovery_max_s'])} | "
            f"{_fmt(f['seconds'])} |"
        )
    return rows


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RESULTS:
        return
    terminalreporter.section("chaos figures")
    for row in table(_RESULTS):
        terminalreporter.write_line(row)
