"""Figures drawn from a benchmark run's JSON (never by hand):
``python -m benchmarks.charts RESULTS.json [OLD.json] --out DIR``.

Writes SVG files into DIR:

- ``throughput.svg``: drain and enqueue rates of every library in the run,
  aiogroupq's own-groups drain beside them (BullMQ's open-source edition has
  no groups: its ungrouped drain is the anchor for that row);
- ``cost.svg``: CPU per task: the server's, stacked by stage (enqueue, drain),
  and the client processes', stacked by component (producer, worker); where
  a result carries ``stages`` (a mapping of stage name to µs per task, at the
  top of a result or in its drain), a third panel stacks those;
- ``compare.svg``, given OLD.json too: each figure of the libraries both runs
  have, old beside new, with the change (for two commits of aiogroupq, run
  on the same machine).

``python -m benchmarks --charts DIR [--baseline OLD.json]`` draws them at the
end of a run. The JSON is what ``python -m benchmarks --json`` (and every run,
in ``benchmarks/.results/``) writes: ``{"meta": {...}, "results": {...}}``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._report import _get, _num, _sum, count, ms, rate, us
from benchmarks._svg import Figure, Panel, Row, Segment

Result = dict[str, Any]

_OURS, _OURS_GROUPED, _BULLMQ, _PEER = "#1f6fb4", "#6aa9e0", "#d9822b", "#9a9a9a"
_OLD, _NEW = "#b8b8b8", "#1f6fb4"
_SERVER_ENQ, _SERVER_DRAIN = "#8c2d19", "#e0694a"
_PRODUCER, _WORKER = "#9ecae1", "#3182bd"
_STAGE_COLORS = (
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Variant:
    """One row of a chart: a library's result and which drain it reads."""

    key: str
    label: str
    result: Result
    drain_key: str = "drain"
    color: str = _PEER

    @property
    def drain(self) -> Result:
        value = self.result.get(self.drain_key)
        return value if isinstance(value, dict) else {}


def variants(results: dict[str, Result]) -> list[Variant]:
    """Every library's ungrouped row, and a row for a grouped drain if any."""
    out = []
    for key, r in results.items():
        color = _OURS if key == "aiogroupq" else _BULLMQ if key == "bullmq" else _PEER
        out.append(Variant(key, str(r.get("label", key)), r, "drain", color))
        if r.get("grouped_drain"):
            out.append(
                Variant(
                    f"{key}/grouped",
                    f"{r.get('label', key)}, own groups",
                    r,
                    "grouped_drain",
                    _OURS_GROUPED,
                )
            )
    return out


def _setting(meta: dict[str, Any]) -> str:
    n = meta.get("drain")
    size = f"N = {n:,}; " if isinstance(n, int) else ""
    return (
        f"aiogroupq {meta.get('revision', '?')}; {meta.get('server', '?')} "
        f"{meta.get('server_version', '?')}; {size}{meta.get('machine', '?')}; "
        f"{meta.get('date', '?')}"
    )


# -- what each figure reads -------------------------------------------------------------

Getter = Callable[[Variant], Any]

_THROUGHPUT: tuple[tuple[str, Getter], ...] = (
    ("drain, jobs/s (one worker process, concurrency 100)",
     lambda v: v.drain.get("jobs_per_s")),
    ("drain, steady jobs/s (10th to 90th percentile completion)",
     lambda v: v.drain.get("steady_per_s")),
    ("enqueue, 100 in flight (/s)", lambda v: _get(v.drain, "enqueue", "per_s")),
    ("enqueue, sequential awaits (/s)",
     lambda v: None if v.drain_key != "drain"
     else v.result.get("enqueue_sequential_per_s")),
    ("enqueue, batch API (/s)",
     lambda v: None if v.drain_key != "drain"
     else _get(v.result, "enqueue_batch", "per_s")),
)  # fmt: skip


def _life(v: Variant, key: str) -> float | None:
    return _sum(_get(v.drain, "enqueue", "server", key), _get(v.drain, "server", key))


#: (title, getter, higher is better, format)
_COMPARED: tuple[tuple[str, Getter, bool, Callable[[Any], str]], ...] = (
    *((title, get, True, rate) for title, get in _THROUGHPUT),
    ("server CPU per task life, µs (enqueue + drain)",
     lambda v: _life(v, "redis_cpu_us"), False, us),
    ("worker CPU per task, µs (drain)",
     lambda v: v.drain.get("worker_cpu_us"), False, us),
    ("producer CPU per task, µs (enqueue, 100 in flight)",
     lambda v: _get(v.drain, "enqueue", "producer_cpu_us"), False, us),
    ("server commands per task life (enqueue + drain)",
     lambda v: _life(v, "commands"), False, count),
    ("idle pickup p99, ms",
     lambda v: None if v.drain_key != "drain"
     else _get(v.result, "latency", "pickup_ms", "p99"), False, ms),
)  # fmt: skip


# -- the figures --------------------------------------------------------------------------


def throughput(data: dict[str, Any]) -> str:
    """Rates of every library of one run, one panel per workload."""
    rows_of = variants(data.get("results") or {})
    figure = Figure("Throughput: aiogroupq beside its peers (higher is better)")
    for title, get in _THROUGHPUT:
        rows = [
            Row(v.label, (Segment(value, v.color, v.label),), rate(value))
            for v in rows_of
            if (value := _num(get(v))) is not None
        ]
        if rows:
            figure.panels.append(Panel(title, tuple(rows)))
    figure.notes.append(_setting(data.get("meta") or {}))
    if "bullmq" in (data.get("results") or {}):
        figure.notes.append(
            "BullMQ (open source) has no groups (BullMQ Pro has): the own-groups "
            "row is compared with BullMQ's ungrouped drain."
        )
    return figure.render()


def _stages(v: Variant) -> dict[str, float]:
    raw = v.drain.get("stages") or v.result.get("stages") or {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): n for k, value in raw.items() if (n := _num(value)) is not None}


def cost(data: dict[str, Any]) -> str:
    """CPU per task: the server's by stage, the clients' by component."""
    rows_of = variants(data.get("results") or {})
    figure = Figure(
        "Cost per task: CPU time, µs (lower is better)",
        legend=[
            Segment(0, _SERVER_ENQ, "server, enqueue (100 in flight)"),
            Segment(0, _SERVER_DRAIN, "server, drain"),
            Segment(0, _PRODUCER, "producer (enqueue)"),
            Segment(0, _WORKER, "worker (drain)"),
        ],
    )
    server, client = [], []
    for v in rows_of:
        enq = _num(_get(v.drain, "enqueue", "server", "redis_cpu_us"))
        drain = _num(_get(v.drain, "server", "redis_cpu_us"))
        if enq is not None and drain is not None:
            server.append(
                Row(
                    v.label,
                    (
                        Segment(enq, _SERVER_ENQ, "server, enqueue"),
                        Segment(drain, _SERVER_DRAIN, "server, drain"),
                    ),
                    f"{us(enq)} + {us(drain)} = {us(enq + drain)}",
                )
            )
        producer = _num(_get(v.drain, "enqueue", "producer_cpu_us"))
        worker = _num(v.drain.get("worker_cpu_us"))
        if producer is not None and worker is not None:
            client.append(
                Row(
                    v.label,
                    (
                        Segment(producer, _PRODUCER, "producer"),
                        Segment(worker, _WORKER, "worker"),
                    ),
                    f"{us(producer)} + {us(worker)} = {us(producer + worker)}",
                )
            )
    if server:
        figure.panels.append(
            Panel("server CPU per task (INFO cpu, delta), by stage", tuple(server))
        )
    if client:
        figure.panels.append(
            Panel(
                "client CPU per task (the processes' own), by component", tuple(client)
            )
        )
    staged = [(v, s) for v in rows_of if (s := _stages(v))]
    if staged:
        names = list(dict.fromkeys(name for _, s in staged for name in s))
        colors = {n: _STAGE_COLORS[i % len(_STAGE_COLORS)] for i, n in enumerate(names)}
        figure.legend += [Segment(0, colors[n], f"stage: {n}") for n in names]
        figure.panels.append(
            Panel(
                "per task, by stage (the result's stages)",
                tuple(
                    Row(
                        v.label,
                        tuple(Segment(s[n], colors[n], n) for n in names if n in s),
                        us(sum(s.values())),
                    )
                    for v, s in staged
                ),
            )
        )
    figure.notes.append(_setting(data.get("meta") or {}))
    return figure.render()


def _change(old: float, new: float, higher_is_better: bool) -> str:
    if old == 0:
        return ""
    delta = new / old - 1
    better = delta > 0 if higher_is_better else delta < 0
    verdict = "same" if abs(delta) < 0.005 else "better" if better else "worse"
    return f" ({delta:+.1%}, {verdict})"


def compare(new: dict[str, Any], old: dict[str, Any]) -> str:
    """Every figure of the libraries both runs have: old beside new."""
    old_meta, new_meta = old.get("meta") or {}, new.get("meta") or {}
    old_rev = str(old_meta.get("revision", "old"))
    new_rev = str(new_meta.get("revision", "new"))
    if old_rev == new_rev:
        old_rev, new_rev = f"{old_rev} (old)", f"{new_rev} (new)"
    olds = {v.key: v for v in variants(old.get("results") or {})}
    pairs = [
        (olds[v.key], v) for v in variants(new.get("results") or {}) if v.key in olds
    ]
    figure = Figure(
        f"aiogroupq {old_rev} against {new_rev}",
        legend=[
            Segment(0, _OLD, f"old: {old_rev}"),
            Segment(0, _NEW, f"new: {new_rev}"),
        ],
    )
    for title, get, higher, fmt in _COMPARED:
        rows = []
        for was, now in pairs:
            a, b = _num(get(was)), _num(get(now))
            if a is None or b is None:
                continue
            rows.append(
                Row(f"{now.label}, {old_rev}", (Segment(a, _OLD, old_rev),), fmt(a))
            )
            rows.append(
                Row(
                    f"{now.label}, {new_rev}",
                    (Segment(b, _NEW, new_rev),),
                    fmt(b) + _change(a, b, higher),
                )
            )
        if rows:
            arrow = "higher is better" if higher else "lower is better"
            figure.panels.append(Panel(f"{title} ({arrow})", tuple(rows)))
    figure.notes += [f"old: {_setting(old_meta)}", f"new: {_setting(new_meta)}"]
    return figure.render()


def write_all(
    data: dict[str, Any], out: Path, baseline: dict[str, Any] | None = None
) -> list[Path]:
    """Write the figures of *data* (and against *baseline*) into *out*."""
    out.mkdir(parents=True, exist_ok=True)
    drawn = {"throughput.svg": throughput(data), "cost.svg": cost(data)}
    if baseline is not None:
        drawn["compare.svg"] = compare(data, baseline)
    paths = []
    for name, svg in drawn.items():
        path = out / name
        path.write_text(svg, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.charts",
        description="SVG figures from a benchmark run's JSON (and an older run's).",
    )
    parser.add_argument(
        "results", type=Path, help="a run's JSON (python -m benchmarks --json)"
    )
    parser.add_argument(
        "old", type=Path, nargs="?", help="an earlier run's JSON: also draw compare.svg"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("."), help="folder for the SVGs"
    )
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text())
    baseline = json.loads(args.old.read_text()) if args.old else None
    for path in write_all(data, args.out, baseline):
        print(path)


if __name__ == "__main__":
    main()
