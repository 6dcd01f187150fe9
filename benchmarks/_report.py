"""Markdown tables from the drivers' JSON results."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

Result = dict[str, Any]

#: how the main table names each workload column
_HIGHER, _LOWER = "higher", "lower"


def _get(result: Result | None, *path: str) -> Any:
    node: Any = result
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _num(value: Any) -> float | None:
    if isinstance(value, int | float) and not math.isnan(value):
        return float(value)
    return None


def rate(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:,.0f}"


def ms(value: Any) -> str:
    v = _num(value)
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def us(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def count(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:.1f}"


def _sum(*values: Any) -> float | None:
    nums = [_num(v) for v in values]
    if any(n is None for n in nums):
        return None
    return sum(n for n in nums if n is not None)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    align = ["---"] + ["--:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# -- the side-by-side table -----------------------------------------------------------


def share(value: Any) -> str:
    v = _num(value)
    return "—" if v is None else f"{v:.0%}"


def _most(*values: Any) -> float | None:
    nums = [v for v in map(_num, values) if v is not None]
    return max(nums) if nums else None


def _spread(stats: Any) -> str:
    """``p50 / p99 (max)`` of a latency record."""
    p50, p99, top = (ms(_get(stats, key)) for key in ("p50", "p99", "max"))
    return "—" if p50 == "—" else f"{p50} / {p99} ({top})"


def _row(label: str, r: Result, drain_key: str, *, grouped: bool) -> list[str]:
    d = r.get(drain_key) or {}
    enq = d.get("enqueue") or {}
    lat = r.get("latency") or {}
    batch = "n/a" if not r.get("has_batch") else rate(_get(r, "enqueue_batch", "per_s"))
    delayed = "n/a" if not r.get("has_delay") else _spread(lat.get("delayed_ms"))
    pickup = _spread(lat.get("pickup_ms"))
    return [
        label,
        "—" if grouped else rate(r.get("enqueue_sequential_per_s")),
        rate(enq.get("per_s")),
        "—" if grouped else batch,
        rate(d.get("jobs_per_s")),
        rate(d.get("steady_per_s")),
        "—" if grouped else pickup,
        "—" if grouped else delayed,
        us(d.get("worker_cpu_us")),
        us(
            _sum(_get(enq, "server", "redis_cpu_us"), _get(d, "server", "redis_cpu_us"))
        ),
        count(_sum(_get(enq, "server", "commands"), _get(d, "server", "commands"))),
        share(
            _most(
                d.get("foreign_cpu_share"),
                None if grouped else r.get("enqueue_foreign_cpu_share"),
                None if grouped else lat.get("foreign_cpu_share"),
            )
        ),
    ]


MAIN_HEADERS = (
    "library",
    "enqueue, sequential (/s)",
    "enqueue, 100 in flight (/s)",
    "enqueue, batch API (/s)",
    "drain (jobs/s)",
    "drain, steady (jobs/s)",
    "idle pickup p50 / p99 (max), ms",
    "delayed lateness p50 / p99 (max), ms",
    "worker CPU (µs/task)",
    "Redis CPU (µs/task)",
    "Redis commands (/task)",
    "others' CPU share (worst workload)",
)


def main_table(results: dict[str, Result]) -> str:
    rows = []
    for r in results.values():
        rows.append(_row(r["label"], r, "drain", grouped=False))
        if r.get("grouped_drain"):
            rows.append(
                _row(
                    f"{r['label']}, every task in its own group",
                    r,
                    "grouped_drain",
                    grouped=True,
                )
            )
    return table(MAIN_HEADERS, rows)


# -- aiogroupq against the best peer ----------------------------------------------------

Metric = tuple[str, Callable[[Result], Any], str, Callable[[Any], str]]

METRICS: tuple[Metric, ...] = (
    (
        "enqueue, sequential (/s)",
        lambda r: r.get("enqueue_sequential_per_s"),
        _HIGHER,
        rate,
    ),
    (
        "enqueue, 100 in flight (/s)",
        lambda r: _get(r, "drain", "enqueue", "per_s"),
        _HIGHER,
        rate,
    ),
    (
        "enqueue, batch API (/s)",
        lambda r: _get(r, "enqueue_batch", "per_s"),
        _HIGHER,
        rate,
    ),
    ("drain (jobs/s)", lambda r: _get(r, "drain", "jobs_per_s"), _HIGHER, rate),
    (
        "drain, steady (jobs/s)",
        lambda r: _get(r, "drain", "steady_per_s"),
        _HIGHER,
        rate,
    ),
    (
        "idle pickup p50 (ms)",
        lambda r: _get(r, "latency", "pickup_ms", "p50"),
        _LOWER,
        ms,
    ),
    (
        "idle pickup p99 (ms)",
        lambda r: _get(r, "latency", "pickup_ms", "p99"),
        _LOWER,
        ms,
    ),
    (
        "delayed lateness p50 (ms)",
        lambda r: _get(r, "latency", "delayed_ms", "p50"),
        _LOWER,
        ms,
    ),
    (
        "delayed lateness p99 (ms)",
        lambda r: _get(r, "latency", "delayed_ms", "p99"),
        _LOWER,
        ms,
    ),
    ("worker CPU (µs/task)", lambda r: _get(r, "drain", "worker_cpu_us"), _LOWER, us),
    (
        "Redis CPU (µs/task)",
        lambda r: _sum(
            _get(r, "drain", "enqueue", "server", "redis_cpu_us"),
            _get(r, "drain", "server", "redis_cpu_us"),
        ),
        _LOWER,
        us,
    ),
    (
        "Redis commands (/task)",
        lambda r: _sum(
            _get(r, "drain", "enqueue", "server", "commands"),
            _get(r, "drain", "server", "commands"),
        ),
        _LOWER,
        count,
    ),
)

GROUPED_METRICS: tuple[Metric, ...] = (
    (
        "grouped: enqueue, 100 in flight (/s)",
        lambda r: _get(r, "grouped_drain", "enqueue", "per_s"),
        _HIGHER,
        rate,
    ),
    (
        "grouped: drain (jobs/s)",
        lambda r: _get(r, "grouped_drain", "jobs_per_s"),
        _HIGHER,
        rate,
    ),
    (
        "grouped: drain, steady (jobs/s)",
        lambda r: _get(r, "grouped_drain", "steady_per_s"),
        _HIGHER,
        rate,
    ),
)


def comparison_table(ours: Result, peers: dict[str, Result]) -> str:
    """Each metric: aiogroupq, the best peer, and aiogroupq's advantage (> 1: ahead)."""
    rows = []
    peer_metrics = {name: (get, better, fmt) for name, get, better, fmt in METRICS}
    grouped_pairs = {
        "grouped: enqueue, 100 in flight (/s)": "enqueue, 100 in flight (/s)",
        "grouped: drain (jobs/s)": "drain (jobs/s)",
        "grouped: drain, steady (jobs/s)": "drain, steady (jobs/s)",
    }
    for name, get, better, fmt in (*METRICS, *GROUPED_METRICS):
        peer_get, _, _ = peer_metrics[grouped_pairs.get(name, name)]
        mine = _num(get(ours))
        scored = [
            (v, r["label"])
            for r in peers.values()
            if (v := _num(peer_get(r))) is not None
        ]
        if not scored:
            rows.append([name, fmt(mine), "no peer offers it", "—"])
            continue
        best_value, best_label = (max if better == _HIGHER else min)(scored)
        if mine is None or best_value <= 0 or mine <= 0:
            ratio = "—"
        else:
            factor = mine / best_value if better == _HIGHER else best_value / mine
            ratio = f"{factor:.2f}x ({'ahead' if factor >= 1 else 'behind'})"
        rows.append([name, fmt(mine), f"{fmt(best_value)} ({best_label})", ratio])
    return table(("metric", "aiogroupq", "best peer", "aiogroupq vs best peer"), rows)


# -- aiogroupq only -----------------------------------------------------------------------


def _ratio(a: Any, b: Any) -> str:
    x, y = _num(a), _num(b)
    return "—" if x is None or not y else f"{x / y:.0%}"


def groups_table(ours: Result) -> str:
    """Grouped drains: uniform, beside a huge one-group backlog, by N processes."""
    uniform = ours.get("grouped_drain") or {}
    runs: list[tuple[str, Result | None, str, str]] = [
        ("ungrouped (for reference)", ours.get("drain"), "—", "—"),
        ("every task its own group (uniform)", uniform, "—", "—"),
    ]
    b = ours.get("backlog_drain")
    if b:
        vs = (
            f"{_ratio(b.get('steady_per_s'), uniform.get('steady_per_s'))} steady, "
            f"{_ratio(b.get('jobs_per_s'), uniform.get('jobs_per_s'))} overall"
        )
        memory = (
            f"{b['server_memory_mb']:,.0f} MiB "
            f"({b['backlog_memory_mb']:,.0f} MiB for the backlog)"
        )
        runs.append((f"beside one group holding {b['backlog']:,} tasks", b, vs, memory))
    batches = ours.get("grouped_batch") or {}
    if batches:
        per = f"{batches['groups']} groups"
        single = batches.get("single") or {}
        runs.append((f"{per}, one task a handler call", single, "—", "—"))
        vs = _ratio(_get(batches, "batch", "jobs_per_s"), single.get("jobs_per_s"))
        label = f"{per}, batch_size={batches['batch_size']}"
        runs.append((label, batches.get("batch"), f"{vs} of one a call", "—"))
    for procs, d in (ours.get("processes") or {}).items():
        plural = "es" if procs != "1" else ""
        runs.append((f"{procs} consumer process{plural}, own groups", d, "—", "—"))
    rows = [
        [
            label,
            rate(d.get("jobs_per_s")),
            rate(d.get("steady_per_s")),
            vs,
            us(_get(d, "server", "redis_cpu_us")),
            memory,
            share(d.get("foreign_cpu_share")),
        ]
        for label, d, vs, memory in runs
        if d
    ]
    return table(
        (
            "aiogroupq drain of N tasks",
            "jobs/s",
            "steady jobs/s",
            "vs uniform",
            "Redis CPU (µs/task, drain)",
            "server memory",
            "others' CPU share",
        ),
        rows,
    )


def _plus(enq: Result, drain: Result, key: str, fmt: Callable[[Any], str]) -> str:
    first, second = _get(enq, "server", key), _get(drain, "server", key)
    return f"{fmt(first)} + {fmt(second)} = {fmt(_sum(first, second))}"


def cost_table(ours: Result) -> str:
    """Per task lifecycle (enqueue + claim + ack)."""
    rows = []
    for label, d, enq in (
        ("ungrouped, enqueue()", ours.get("drain"), _get(ours, "drain", "enqueue")),
        (
            "own group, enqueue()",
            ours.get("grouped_drain"),
            _get(ours, "grouped_drain", "enqueue"),
        ),
        ("ungrouped, enqueue_many()", ours.get("drain"), ours.get("enqueue_batch")),
    ):
        if not d or not enq:
            continue
        rows.append(
            [
                label,
                us(enq.get("producer_cpu_us")),
                us(d.get("worker_cpu_us")),
                _plus(enq, d, "redis_cpu_us", us),
                _plus(enq, d, "script_us", us),
                _plus(enq, d, "commands", count),
            ]
        )
    return table(
        (
            "aiogroupq, per task",
            "producer CPU (µs)",
            "worker CPU (µs)",
            "Redis CPU (µs), enqueue + drain",
            "script time, commandstats (µs)",
            "Redis commands, enqueue + drain",
        ),
        rows,
    )


def _times(mine: float | None, floor: float | None) -> str:
    return "—" if mine is None or not floor else f"{mine / floor:.1f}x"


def floor_table(ours: Result, floor: Result) -> str:
    """aiogroupq's server CPU per task, by stage, against the floor's
    (:mod:`benchmarks.floor`: bare scripts, batched as aiogroupq's calls, run
    on the same server after the libraries)."""
    variants = (
        # (floor's variant, aiogroupq's drain, aiogroupq's enqueue measurement)
        (
            "ungrouped",
            ours.get("drain"),
            ours.get("enqueue_batch") or _get(ours, "drain", "enqueue"),
        ),
        (
            "own_groups",
            ours.get("grouped_drain"),
            _get(ours, "grouped_drain", "enqueue"),
        ),
    )
    stages: list[tuple[str, str]] = [
        ("enqueue", "enqueue"),
        ("drain: claim + finish", "drain"),
        ("task life", "life"),
    ]
    rows = []
    for label, stage in stages:
        row = [label]
        for key, drain, enq in variants:
            f = floor.get(key) or {}
            claim, finish = (
                _get(f, "claim", "redis_cpu_us"),
                _get(f, "finish", "redis_cpu_us"),
            )
            mine_enq = _num(_get(enq, "server", "redis_cpu_us"))
            mine_drain = _num(_get(drain, "server", "redis_cpu_us"))
            if stage == "enqueue":
                mine, theirs = mine_enq, _num(_get(f, "enqueue", "redis_cpu_us"))
                shown = us(theirs)
            elif stage == "drain":
                mine, theirs = mine_drain, _sum(claim, finish)
                shown = f"{us(claim)} + {us(finish)} = {us(theirs)}"
            else:
                mine = _sum(mine_enq, mine_drain)
                theirs = _num(_get(f, "total", "redis_cpu_us"))
                shown = us(theirs)
            row += [us(mine), shown, _times(mine, theirs)]
        rows.append(row)
    enqueue_kind = (
        "enqueue_many()" if ours.get("enqueue_batch") else "enqueue(), 100 in flight"
    )
    return table(
        (
            "server CPU per task (µs)",
            f"aiogroupq, ungrouped ({enqueue_kind})",
            "floor, ungrouped",
            "aiogroupq / floor",
            "aiogroupq, own groups (enqueue(), 100 in flight)",
            "floor, own groups",
            "aiogroupq / floor",
        ),
        rows,
    )


def targets_table(ours: Result, peers: dict[str, Result]) -> str:
    """The DESIGN.md targets that one run can check."""
    rows = [
        *_ahead_of_peers(ours, peers),
        *_against_bullmq(ours, peers.get("bullmq")),
        *_under_limits(ours),
        *_group_shares(ours),
    ]
    return table(("target (DESIGN.md)", "this run", "verdict"), rows)


def _ahead_of_peers(ours: Result, peers: dict[str, Result]) -> list[list[str]]:
    """The targets of being faster than every peer measured."""

    def best(get: Callable[[Result], Any]) -> tuple[float | None, str]:
        scored = [
            (v, r["label"]) for r in peers.values() if (v := _num(get(r))) is not None
        ]
        return max(scored) if scored else (None, "")

    rows = []

    def ahead(name: str, mine: Any, get: Callable[[Result], Any]) -> None:
        value, label = best(get)
        m = _num(mine)
        if m is None or value is None:
            rows.append([name, rate(m), "no peer in this run" if m else "not measured"])
            return
        verdict = "met" if m > value else "missed"
        rows.append(
            [
                name,
                f"{rate(m)} vs {rate(value)} ({label})",
                f"{verdict} ({m / value:.2f}x)",
            ]
        )

    ahead(
        "drain ahead of every peer (ungrouped)",
        _get(ours, "drain", "jobs_per_s"),
        lambda r: _get(r, "drain", "jobs_per_s"),
    )
    ahead(
        "drain ahead of every peer (grouped)",
        _get(ours, "grouped_drain", "jobs_per_s"),
        lambda r: _get(r, "drain", "jobs_per_s"),
    )
    ahead(
        "enqueue ahead, sequential",
        ours.get("enqueue_sequential_per_s"),
        lambda r: r.get("enqueue_sequential_per_s"),
    )
    ahead(
        "enqueue ahead, 100 in flight",
        _get(ours, "drain", "enqueue", "per_s"),
        lambda r: _get(r, "drain", "enqueue", "per_s"),
    )
    ahead(
        "enqueue ahead, batch API",
        _get(ours, "enqueue_batch", "per_s"),
        lambda r: _get(r, "enqueue_batch", "per_s"),
    )
    return rows


def _life_cpu(r: Result, drain_key: str = "drain") -> float | None:
    """Server CPU of one task's life: its enqueue (100 in flight) and drain."""
    return _sum(
        _get(r, drain_key, "enqueue", "server", "redis_cpu_us"),
        _get(r, drain_key, "server", "redis_cpu_us"),
    )


def _against_bullmq(ours: Result, bullmq: Result | None) -> list[list[str]]:
    """DESIGN.md's targets against BullMQ. BullMQ's open-source edition has no
    groups, so its ungrouped drain is the anchor of the grouped target too."""
    if not bullmq:
        return []
    rows = []
    anchor = _num(_get(bullmq, "drain", "jobs_per_s"))

    def ratio_row(name: str, mine: Any, theirs: Any, floor: float) -> None:
        m, t = _num(mine), _num(theirs)
        if m is None or not t:
            rows.append([name, "—", "not measured"])
            return
        factor = m / t
        verdict = "met" if factor >= floor else "missed"
        rows.append([name, f"{rate(m)} vs {rate(t)}", f"{verdict} ({factor:.2f}x)"])

    ratio_row(
        "drain ≥ 1.25x BullMQ's (ungrouped)",
        _get(ours, "drain", "jobs_per_s"),
        anchor,
        1.25,
    )
    ratio_row(
        "drain ≥ 1.1x BullMQ's, every task in its own group "
        "(against BullMQ's ungrouped drain: groups are BullMQ Pro only)",
        _get(ours, "grouped_drain", "jobs_per_s"),
        anchor,
        1.1,
    )
    mine, theirs = _life_cpu(ours), _life_cpu(bullmq)
    name = "server CPU per task life ≤ 0.35x BullMQ's (enqueue + drain)"
    if mine is None or not theirs:
        rows.append([name, "—", "not measured"])
    else:
        factor = mine / theirs
        rows.append(
            [
                name,
                f"{us(mine)} vs {us(theirs)} µs",
                f"{'met' if factor <= 0.35 else 'missed'} ({factor:.2f}x)",
            ]
        )
    return rows


def _under_limits(ours: Result) -> list[list[str]]:
    """The latency targets."""
    rows = []

    def under(name: str, value: Any, limit: float, unit: str) -> None:
        v = _num(value)
        if v is None:
            rows.append([name, "—", "not measured"])
            return
        verdict = "met" if v < limit else "missed"
        rows.append([name, f"{ms(v)} {unit}", f"{verdict} (limit {limit:g} {unit})"])

    under("idle pickup p99 < 5 ms", _get(ours, "latency", "pickup_ms", "p99"), 5, "ms")
    under(
        "delayed lateness p99 < 10 ms",
        _get(ours, "latency", "delayed_ms", "p99"),
        10,
        "ms",
    )
    return rows


def _group_shares(ours: Result) -> list[list[str]]:
    """The targets of groups costing little: a big backlog against uniform
    groups, and one process against BullMQ's grouped figure."""
    rows = []
    b, u = ours.get("backlog_drain") or {}, ours.get("grouped_drain") or {}
    bs, us_ = _num(b.get("steady_per_s")), _num(u.get("steady_per_s"))
    if bs and us_:
        share = bs / us_
        rows.append(
            [
                f"{b.get('backlog', 0):,}-task group backlog ≥ 80 % of uniform",
                f"{share:.0%} (steady {rate(bs)} vs {rate(us_)})",
                "met" if share >= 0.8 else "missed",
            ]
        )
    g = _num(_get(ours, "grouped_drain", "jobs_per_s"))
    if g:
        rows.append(
            [
                "one process, groups on, toward BullMQ's 15,000-17,000/s",
                f"{rate(g)} jobs/s",
                "met" if g >= 15_000 else f"{g / 15_000:.0%} of 15,000",
            ]
        )
    return rows


def report(meta: dict[str, Any], results: dict[str, Result]) -> str:
    ours = results.get("aiogroupq")
    peers = {k: v for k, v in results.items() if k != "aiogroupq"}
    setting = (
        f"aiogroupq at {meta.get('revision', '?')}. "
        f"Machine: {meta['machine']}; Python {meta['python']}; "
        f"{meta['server']} {meta['server_version']} (persistence off, hz "
        f"{meta['server_hz']}); concurrency {meta['concurrency']} per worker process; "
        f"event loop {meta.get('loop', 'asyncio')}; "
        f"N = {meta['drain']:,}; load average before / after the run: "
        f"{meta.get('loadavg_before', '?')} / {meta.get('loadavg_after', '?')}; "
        f"{meta.get('seconds', '?')} s in all."
    )
    foreign = ", ".join(
        f"{r['label']} {r['foreign_cpu_share']:.0%}"
        for r in results.values()
        if "foreign_cpu_share" in r
    )
    if foreign:
        setting += (
            " Share of the machine's CPU used by other processes while each "
            f"library ran: {foreign}."
        )
    parts = [
        setting,
        "",
        "Versions: "
        + "; ".join(
            f"{r['label']}: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items())
            for r in results.values()
        ),
        "",
        main_table(results),
    ]
    skipped = meta.get("skipped") or {}
    if skipped:
        parts[3:3] = [
            "",
            "Skipped: " + "; ".join(f"{key}: {why}" for key, why in skipped.items()),
        ]
    if ours and peers:
        parts += ["", comparison_table(ours, peers)]
    if ours and ours.get("has_groups"):
        parts += ["", groups_table(ours), "", cost_table(ours)]
    floor = meta.get("floor")
    if floor:
        batches = floor.get("batches") or {}
        about = (
            f"The floor (python -m benchmarks.floor, {floor.get('via', '?')}, "
            f"N = {floor.get('tasks', 0):,}, median of {floor.get('rounds', '?')} "
            f"round(s)): bare scripts enqueueing by {batches.get('enqueue', '?')}, "
            f"claiming by {batches.get('claim', '?')}, finishing by "
            f"{batches.get('finish', '?')}, on this run's server."
        )
        parts += ["", about, "", floor_table(ours or {}, floor)]
    if ours:
        parts += ["", targets_table(ours, peers)]
    return "\n".join(parts) + "\n"
