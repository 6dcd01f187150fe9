"""Throughput and failure rate over the last minutes: samples of a queue's
monotonic totals (:attr:`QueueStats.totals`), and the charts drawn from them
as inline SVG on the server (no JavaScript library, nothing to download).

Rates are the differences of the totals between two samples, divided by the
time between them on the Redis server's clock: a gap in the samples (nobody
watched, Redis was down) shows as the average over the gap, never as a spike.
"""

from __future__ import annotations

__all__ = (
    "History",
    "Interval",
    "failure_chart",
    "throughput_chart",
    "window_text",
)

import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from markupsafe import Markup

if TYPE_CHECKING:
    from .._inspect.views import QueueStats

#: the totals that count attempts ending in a failure: a retry after a
#: failure (or a ``Retry``) and a dead letter
FAILED: Final = ("retried", "dead")
#: chart size in SVG user units (the CSS scales it to the page)
WIDTH: Final = 640
HEIGHT: Final = 150
#: room for the y-axis labels on the left and the time labels below
_LEFT: Final = 44
_BOTTOM: Final = 18
_TOP: Final = 8


@dataclass(frozen=True, slots=True)
class Sample:
    """A queue's totals at one moment of the server's clock."""

    at: float
    totals: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Interval:
    """What happened between two samples, per second.

    :ivar start: the earlier sample's time
    :ivar end: the later sample's time
    :ivar enqueued: tasks enqueued per second
    :ivar succeeded: tasks succeeded per second
    :ivar failed: attempts that failed per second (retries and dead letters)
    :ivar failure_rate: failed / (succeeded + failed) in the interval, from 0
        to 1; ``None`` when no attempt ended in it
    """

    start: float
    end: float
    enqueued: float
    succeeded: float
    failed: float
    failure_rate: float | None


class History:
    """The samples of one queue over the last *window* seconds.

    :param window: seconds of history kept
    :param min_gap: a sample closer than this to the previous one is dropped
        (several open pages each take one per refresh)
    """

    def __init__(self, window: float, min_gap: float) -> None:
        self.window = window
        self.min_gap = min_gap
        self._samples: deque[Sample] = deque()

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def latest(self) -> float | None:
        """The time of the latest sample, if any."""
        return self._samples[-1].at if self._samples else None

    def add(self, stats: QueueStats) -> None:
        """Record the totals of *stats* (read at ``stats.now``)."""
        if self._samples:
            last = self._samples[-1]
            if stats.now < last.at + self.min_gap:
                return
            if any(stats.totals.get(k, 0) < n for k, n in last.totals.items()):
                # Totals only grow: the queue's keys were deleted (or another
                # server answers); rates across that would be nonsense.
                self._samples.clear()
        self._samples.append(Sample(stats.now, dict(stats.totals)))
        while self._samples and self._samples[0].at < stats.now - self.window:
            self._samples.popleft()

    def rates(self, seconds: float) -> dict[str, float] | None:
        """Each total's average growth per second over about the last
        *seconds* (from the latest sample back to the first sample at least
        that old, else the oldest); ``None`` with fewer than two samples."""
        if len(self._samples) < 2:
            return None
        last = self._samples[-1]
        first = self._samples[0]
        for sample in reversed(self._samples):
            if sample.at <= last.at - seconds:
                first = sample
                break
        elapsed = last.at - first.at
        if elapsed <= 0:
            return None
        return {
            name: (n - first.totals.get(name, 0)) / elapsed
            for name, n in last.totals.items()
        }

    def intervals(self) -> list[Interval]:
        """The rates between consecutive samples, oldest first."""
        out = []
        samples = self._samples
        for before, after in itertools.pairwise(samples):
            elapsed = after.at - before.at
            if elapsed <= 0:
                continue

            def grew(*names: str, a: Sample = after, b: Sample = before) -> int:
                return sum(a.totals.get(n, 0) - b.totals.get(n, 0) for n in names)

            succeeded, failed = grew("succeeded"), grew(*FAILED)
            ended = succeeded + failed
            out.append(
                Interval(
                    start=before.at,
                    end=after.at,
                    enqueued=grew("enqueued") / elapsed,
                    succeeded=succeeded / elapsed,
                    failed=failed / elapsed,
                    failure_rate=failed / ended if ended else None,
                )
            )
        return out


@dataclass(frozen=True, slots=True)
class _Series:
    name: str
    css: str
    values: Sequence[float | None]


def throughput_chart(
    intervals: Sequence[Interval], now: float, window: float
) -> Markup:
    """Tasks enqueued, succeeded and failed per second over the window."""
    return _chart(
        intervals,
        now,
        window,
        [
            _Series("enqueued/s", "s-enqueued", [i.enqueued for i in intervals]),
            _Series("succeeded/s", "s-succeeded", [i.succeeded for i in intervals]),
            _Series("failed/s", "s-failed", [i.failed for i in intervals]),
        ],
        unit="/s",
        label="tasks per second",
    )


def failure_chart(intervals: Sequence[Interval], now: float, window: float) -> Markup:
    """The share of ended attempts that failed, in percent."""
    rates = [
        None if i.failure_rate is None else i.failure_rate * 100 for i in intervals
    ]
    return _chart(
        intervals,
        now,
        window,
        [_Series("failure rate", "s-failed", rates)],
        unit="%",
        label="failure rate",
        floor_max=10.0,
    )


def nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is >= *value*
    (the top of the y axis), at least 1."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _chart(
    intervals: Sequence[Interval],
    now: float,
    window: float,
    series: Sequence[_Series],
    *,
    unit: str,
    label: str,
    floor_max: float = 1.0,
) -> Markup:
    start = now - window
    plot_w, plot_h = WIDTH - _LEFT - 4, HEIGHT - _BOTTOM - _TOP
    peak = max((v for s in series for v in s.values if v is not None), default=0.0)
    top = nice_max(max(peak, floor_max))

    def x(at: float) -> float:
        return _LEFT + plot_w * min(max((at - start) / window, 0.0), 1.0)

    def y(value: float) -> float:
        return _TOP + plot_h * (1 - min(value / top, 1.0))

    parts = [
        (
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{label}" xmlns="http://www.w3.org/2000/svg">'
        ),
        f"<title>{label}</title>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        value = top * fraction
        gy = y(value)
        parts.append(
            f'<line class="grid" x1="{_LEFT}" y1="{gy:.1f}" '
            f'x2="{WIDTH - 4}" y2="{gy:.1f}"/>'
        )
        parts.append(
            f'<text class="axis" x="{_LEFT - 4}" y="{gy + 4:.1f}" '
            f'text-anchor="end">{_figure(value)}{unit}</text>'
        )
    base = HEIGHT - 4
    parts.append(
        f'<text class="axis" x="{_LEFT}" y="{base}">-{window_text(window)}</text>'
    )
    parts.append(
        f'<text class="axis" x="{WIDTH - 4}" y="{base}" text-anchor="end">now</text>'
    )
    if not intervals:
        parts.append(
            f'<text class="empty" x="{_LEFT + plot_w / 2:.1f}" '
            f'y="{_TOP + plot_h / 2:.1f}" text-anchor="middle">'
            "collecting samples…</text>"
        )
    typical = _typical_gap(intervals)
    for s in series:
        for run in _runs(intervals, s.values, typical):
            points = " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in run)
            if len(run) == 1:  # a lone interval: a dot, not an invisible line
                ((at, v),) = run
                parts.append(
                    f'<circle class="{s.css}" cx="{x(at):.1f}" cy="{y(v):.1f}" r="2"/>'
                )
            else:
                parts.append(
                    f'<polyline class="line {s.css}" points="{points}">'
                    f"<title>{s.name}</title></polyline>"
                )
    parts.append("</svg>")
    # Built from numbers and our own constant names only: nothing to escape.
    return Markup("".join(parts))


def _typical_gap(intervals: Sequence[Interval]) -> float:
    gaps = sorted(i.end - i.start for i in intervals)
    return gaps[len(gaps) // 2] if gaps else 0.0


def _runs(
    intervals: Sequence[Interval],
    values: Sequence[float | None],
    typical: float,
) -> list[list[tuple[float, float]]]:
    """The points of a series cut where it has no value, or where the
    samples stopped for much longer than usual (the line would lie there);
    each interval is drawn at its midpoint."""
    runs: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    for interval, value in zip(intervals, values, strict=True):
        long_gap = typical > 0 and interval.end - interval.start > 5 * typical
        if value is None or long_gap:
            if current:
                runs.append(current)
            current = []
            if value is not None:  # an average over the gap: its own run
                runs.append([((interval.start + interval.end) / 2, value)])
            continue
        current.append(((interval.start + interval.end) / 2, value))
    if current:
        runs.append(current)
    return runs


def _figure(value: float) -> str:
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def window_text(seconds: float) -> str:
    """A history window for people: '90 s', '10 min'."""
    if seconds >= 120:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"
