"""Plain-text rendering for the operator commands: tables, durations,
progress, and JSON (no dependency beyond msgspec).

Whatever stored text a page shows (ids, groups, types, errors, tracebacks,
consumer names, payloads) is shown through :func:`~.printable.printable`:
table cells and field values here, every line again in ``_cli/stdout.py``.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Any, Final, Literal

import msgspec

from .._store.assignment import share_text
from .estimate import StartEstimate, shown
from .printable import json_printable, printable
from .views import (
    ConsumerInfo,
    GroupInfo,
    GroupTask,
    QueueStats,
    TaskDetails,
    span_text,
)

if TYPE_CHECKING:
    from ..task import DeadLetter

#: characters of a reason or payload shown in a table cell
CELL: Final = 60
#: the narrowest a table's last column is wrapped to, however narrow the
#: terminal (narrower, a sentence would be a word per line)
MIN_LAST: Final = 24


def count(n: int) -> str:
    """1234567 -> '1,234,567'."""
    return f"{n:,}"


def span(seconds: float | None) -> str:
    """A duration for people, '-' if unknown."""
    return "-" if seconds is None else span_text(seconds)


def ago(now: float, then: float | None) -> str:
    return "-" if then is None else f"{span_text(now - then)} ago"


def until(now: float, then: float | None) -> str:
    if then is None:
        return "-"
    return f"in {span_text(then - now)}" if then > now else "now (overdue)"


def clock(at: float | None) -> str:
    """A server timestamp as UTC, to the millisecond."""
    if at is None:
        return "-"
    try:
        stamp = datetime.fromtimestamp(at, UTC)
    except (OverflowError, ValueError, OSError):  # a stored time out of range
        return f"{at:.3f} (not a date)"
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def short(text: str | None, width: int = CELL) -> str:
    """One line of at most *width* characters."""
    if not text:
        return "-"
    line = printable(" ".join(text.split()))
    return line if len(line) <= width else line[: width - 1] + "…"


def terminal_width(stream: IO[str] | None = None) -> int | None:
    """The columns a table is fitted to: the terminal's width (``COLUMNS``
    if set) when *stream* (stdout by default) is a terminal; ``None``, no
    limit, when it is not (a file or a pipe gets whole lines)."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # no file behind it, or closed
        tty = False
    return shutil.get_terminal_size().columns if tty else None


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    width: int | Literal["terminal"] | None = "terminal",
) -> str:
    """Columns padded to their widest cell; numbers aligned right. The last
    column (a reason, as a rule) is wrapped onto more lines to fit *width*
    characters, never cut; ``"terminal"``: :func:`terminal_width`, ``None``:
    one line per row however long."""
    cells = [[printable(str(c)) for c in row] for row in rows]
    numeric = [
        all(_is_number(row[i]) for row in cells) and bool(cells)
        for i in range(len(headers))
    ]
    widths = [
        max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)
    ]
    limit = terminal_width() if width == "terminal" else width
    if limit is not None and headers:
        room = limit - sum(widths[:-1]) - 2 * (len(headers) - 1)
        widths[-1] = min(widths[-1], max(room, MIN_LAST, len(headers[-1])))

    def lines(row: Sequence[str]) -> list[str]:
        last = row[-1]
        pieces = [last]
        if len(last) > widths[-1]:
            pieces = textwrap.wrap(
                last, widths[-1], break_long_words=True, break_on_hyphens=False
            ) or [last]
        out = []
        for n, piece in enumerate(pieces):
            shown = [*row[:-1], piece] if n == 0 else ["" for _ in row[:-1]] + [piece]
            parts = [
                c.rjust(w) if num and n == 0 else c.ljust(w)
                for c, w, num in zip(shown, widths, numeric, strict=True)
            ]
            out.append("  ".join(parts).rstrip())
        return out

    out = lines(list(headers))
    for row in cells:
        out += lines(row)
    return "\n".join(out)


def _is_number(text: str) -> bool:
    return text.replace(",", "").isdigit()


def fields(pairs: Iterable[tuple[str, object]], indent: str = "  ") -> str:
    """'name:  value' lines, values aligned."""
    items = [(name, printable(str(value))) for name, value in pairs]
    width = max((len(name) for name, _ in items), default=0) + 1
    return "\n".join(f"{indent}{(name + ':').ljust(width)}  {v}" for name, v in items)


def to_json(value: Any, *, pretty: bool = True) -> str:
    """JSON of a view (dataclasses, enums, mappings); bytes become base64."""
    data = msgspec.json.encode(value)
    text = (msgspec.json.format(data, indent=2) if pretty else data).decode()
    return json_printable(text)


# -- views ---------------------------------------------------------------------


def render_stats(stats: QueueStats, rates: Mapping[str, float] | None = None) -> str:
    """The stats command's page; *rates* (per second) in watch mode."""
    now = stats.now
    state = "PAUSED: nothing starts" if stats.paused else "running"
    alive = [c.last_heartbeat for c in stats.consumers]
    beats = (
        f"heartbeats {span(now - max(alive))} to {span(now - min(alive))} ago"
        if alive
        else "no live consumer: nothing runs"
    )
    rows: list[tuple[str, str, str] | str] = [
        "tasks",
        ("ready", count(stats.ready), "waiting for a consumer"),
        ("parked", count(stats.parked), "in the lines of busy groups"),
        ("held", count(stats.held), "held back: group paused, halted or out of rate"),
        ("delayed", count(stats.delayed), f"next due {_due(stats.next_due_in)}"),
        ("running", count(stats.running), ""),
        ("dead", count(stats.dead), ""),
        ("oldest waiting", span(stats.oldest_waiting), ""),
        "groups",
        ("with tasks", count(stats.groups), ""),
        ("with a line", count(stats.groups_waiting), ""),
        ("halted", count(stats.groups_halted), ""),
        ("paused", count(stats.groups_paused), ""),
        ("rate-limited", count(stats.groups_rate_limited), ""),
        "consumers",
        ("alive", count(stats.consumers_alive), beats),
        ("gone", count(stats.consumers_gone), "silent past their lease"),
        "totals since the queue began",
        *(
            (name, count(n), f"{rates[name]:,.1f}/s" if rates else "")
            for name, n in stats.totals.items()
        ),
    ]  # fmt: skip
    return f"queue {stats.queue!r} ({state}) at {clock(now)}\n" + _block(rows)


def _block(rows: Sequence[tuple[str, str, str] | str]) -> str:
    """Headings, and label / right-aligned figure / note lines under them."""
    lines = [r for r in rows if not isinstance(r, str)]
    label_width = max(len(printable(label)) for label, _, _ in lines)
    figure_width = max(len(figure) for _, figure, _ in lines)
    out = []
    for row in rows:
        if isinstance(row, str):
            out.append(printable(row))
            continue
        label, figure, note = map(printable, row)
        line = f"  {label.ljust(label_width)}  {figure.rjust(figure_width)}  {note}"
        out.append(line.rstrip())
    return "\n".join(out)


def _due(seconds: float | None) -> str:
    return "-" if seconds is None else f"in {span(seconds)}"


GROUP_HEADERS: Final = ("GROUP", "STATE", "RUNNING", "BACKLOG", "OLDEST", "WHY")


def group_row(info: GroupInfo) -> tuple[object, ...]:
    return (
        info.group,
        info.state,
        count(info.running),
        count(info.backlog),
        span(info.oldest_age),
        " ".join(info.reason.split()) or "-",  # whole: table() wraps it
    )


def render_group(info: GroupInfo) -> str:
    now = info.now
    rate = "none"
    if info.rate is not None:
        rate = f"{info.rate[0]} starts per {span(info.rate[1])}"
        if info.rate_free_at is not None:
            rate += f", next start {until(now, info.rate_free_at)}"
    size = "no limit"
    if info.max_size is not None:
        size = f"{count(info.max_size)}" + (
            " (full: enqueues are refused)" if info.full else ""
        )
    since = ""
    if info.waiting_since is not None:
        since = f" (the line has not been empty for {span(now - info.waiting_since)})"
    head = "-"
    if info.head is not None:
        head = f"{info.head.id} ({info.head.slot}"
        if info.head.due_at is not None and info.head.slot != "line":
            head += f", due {until(now, info.head.due_at)}"
        head += ")"
    out = [
        f"group {info.group!r}: {info.state}",
        fields(
            [
                ("why", info.reason),
                ("running", f"{info.running} of concurrency {info.concurrency}"),
                ("weight", str(info.weight)),
                ("ordering", info.ordering),
                ("next", head),
                ("in line", count(info.backlog) + since),
                ("delayed", count(info.delayed) + _first_due(info)),
                ("oldest waiting", span(info.oldest_age)),
                ("rate limit", rate),
                ("max size", size),
                ("paused", _paused(info)),
                ("halted by", info.halted_by or "-"),
            ]
        ),
    ]  # fmt: skip
    if info.holders:
        out += ["slot holders", _indent(holder_table(now, info.holders))]
    return "\n".join(out)


def _first_due(info: GroupInfo) -> str:
    if info.next_due_at is None:
        return ""
    return f" (the first due {until(info.now, info.next_due_at)})"


def _paused(info: GroupInfo) -> str:
    if info.paused and info.queue_paused:
        return "yes (the group and the queue)"
    if info.paused:
        return "yes"
    return "the whole queue" if info.queue_paused else "no"


def holder_table(now: float, holders: Sequence[GroupTask]) -> str:
    rows = [
        (
            h.id,
            h.slot,
            f"{h.attempt}/{h.max_attempts}",
            consumer_text(
                now,
                h.consumer,
                h.consumer_alive,
                h.consumer_heartbeat,
                h.consumer_status,
            ),
            until(now, h.lease_deadline)
            if h.slot == "running"
            else until(now, h.due_at),
        )
        for h in holders
    ]
    return table(("TASK", "SLOT", "ATTEMPT", "CONSUMER", "LEASE ENDS / DUE"), rows)


def consumer_text(
    now: float,
    name: str | None,
    alive: bool | None,
    heartbeat: float | None,
    status: str | None = None,
) -> str:
    """A running task's consumer, marked when it is not alive or silent
    (*status*, as :attr:`ConsumerInfo.status` says it, where known)."""
    if name is None:
        return "-"
    if status not in (None, "alive", "not registered"):
        return f"{name} ({status})"
    if alive is not False:
        return name
    if heartbeat is None:
        return f"{name} (not alive)"
    return f"{name} (not alive: silent {span(now - heartbeat)})"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


#: a waiting task's estimate, or why it has none, for a task's page
estimate_of: Final = shown


def estimate_text(estimate: StartEstimate | str | None) -> str:
    """A waiting task's start estimate (or why it has none) for people."""
    if estimate is None:
        return "-"
    if isinstance(estimate, str):
        return estimate
    at = estimate.starts_at
    return f"{until(estimate.now, at)} ({clock(at)}): {estimate.basis}"


def task_json(details: TaskDetails, estimate: StartEstimate | str | None) -> str:
    """``task --json``: the task's view, with ``estimate`` (an object, or
    ``null`` with ``estimate_note`` saying why) for a waiting task."""
    data: dict[str, Any] = msgspec.to_builtins(details)
    if details.state in ("queued", "delayed"):
        if isinstance(estimate, StartEstimate):
            data["estimate"] = msgspec.to_builtins(estimate)
        else:
            data["estimate"] = None
            data["estimate_note"] = estimate or ""
    return to_json(data)


def render_task(t: TaskDetails, estimate: StartEstimate | str | None = None) -> str:
    now = t.now
    where = "-"
    if t.slot is not None:
        where = (
            t.slot
            if t.position is None
            else f"{t.slot}, {t.position} ahead in its group"
        )
    pairs: list[tuple[str, object]] = [
        ("state", t.state + (" (cancellation requested)" if t.cancel_requested else "")),
        ("why", t.reason or "-"),
        ("type", t.type or "-"),
        ("group", t.group or "-"),
        ("place", where),
        ("attempt", f"{t.attempt} of {t.max_attempts}"),
        ("priority", t.priority),
        ("consumer", consumer_text(now, t.consumer, t.consumer_alive, t.consumer_heartbeat, t.consumer_status)),
        ("lease ends", until(now, t.lease_deadline)),
        ("due", until(now, t.due_at)),
        ("expected start", estimate_text(estimate)),
        ("runnable since", ago(now, t.runnable_since)),
        ("enqueued", f"{clock(t.enqueued_at)} ({ago(now, t.enqueued_at)})"),
        ("ended", f"{clock(t.ended_at)} ({ago(now, t.ended_at)})" if t.ended_at else "-"),
        ("expires", clock(t.expires_at)),
        ("error", t.error or "-"),
        ("result stored", "yes" if t.has_result else "no"),
        ("state kept for", span(t.kept_for) if t.kept_for is not None else "-"),
        ("payload size", size_text(t.payload_size)),
        ("payload", _payload(t)),
    ]  # fmt: skip
    out = [f"task {printable(t.id)}", fields(pairs)]
    if t.traceback:
        # Its lines stay lines; any other control character is shown.
        out += ["traceback", _indent(printable(t.traceback.rstrip(), keep="\n"))]
    return "\n".join(out)


def _payload(t: TaskDetails) -> str:
    if t.state in ("succeeded", "cancelled", "expired"):
        return "- (not kept once a task ends; its size is)"
    return short(repr(t.payload), 200)


def size_text(size: int | None) -> str:
    """A size in bytes for people: 512 B, 1.5 KiB, 2.0 MiB; '-' if unknown."""
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / (1024 * 1024):.1f} MiB"


DEAD_HEADERS: Final = ("TASK", "TYPE", "GROUP", "ATTEMPTS", "DEAD SINCE", "REASON")


def dead_rows(now: float, letters: Sequence[DeadLetter]) -> list[tuple[object, ...]]:
    return [
        (
            d.id,
            d.type,
            d.group or "-",
            count(d.attempts),
            ago(now, d.dead_at),
            short(d.reason),
        )
        for d in letters
    ]


CONSUMER_HEADERS: Final = (
    "NAME", "HOST", "PID", "STATE", "IN FLIGHT", "CONCURRENCY", "PARTITIONS",
    "HEARTBEAT", "UP", "CLAIMED", "SUCCEEDED", "DEAD",
)  # fmt: skip


def consumer_rows(
    now: float, consumers: Sequence[ConsumerInfo]
) -> list[tuple[object, ...]]:
    return [
        (
            c.name,
            c.host,
            c.pid,
            c.status,
            count(c.in_flight),
            count(c.concurrency),
            "-" if c.partitions is None else (share_text(c.partitions) or "none"),
            ago(now, c.last_heartbeat),
            span(now - c.started),
            count(c.stats.claimed),
            count(c.stats.succeeded),
            count(c.stats.dead),
        )
        for c in consumers
    ]


# -- progress ------------------------------------------------------------------


class Progress:
    """A progress bar on a terminal; elsewhere, one line per update (at most
    one every half second, and the last)."""

    def __init__(self, label: str, total: int, stream: IO[str] | None = None) -> None:
        self.label, self.total = label, total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0
        self._shown = -1

    def update(self, done: int, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last < (0.05 if self.tty else 0.5):
            return
        if done == self._shown and not (final and self.tty):
            return
        self._last, self._shown = now, done
        total = max(self.total, done)
        if self.tty:
            filled = 30 * done // total if total else 30
            bar = "#" * filled + "-" * (30 - filled)
            end = "\n" if final else ""
            self.stream.write(
                f"\r{self.label} [{bar}] {count(done)}/{count(total)}{end}"
            )
        else:
            self.stream.write(f"{self.label}: {count(done)}/{count(total)}\n")
        self.stream.flush()
