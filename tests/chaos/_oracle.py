"""The chaos oracle: judges a run's journal against the invariants.

Input: the journal lines (see :mod:`._journal`), what was enqueued (task id,
group and position in its group per sequence number) and each task's final
state and applied token (the ``f`` field ``finish.lua`` leaves in the task's
hash). Output: a :class:`Verdict`, whose :attr:`Verdict.violations` must be
empty. The rules, each a figure of the report:

- **lost**: an enqueued task that did not end ``succeeded`` (the workload
  expects no dead letters: its tasks fail at most once, with room to retry).
- **overlap** (group exclusion): a run of a group starts while another run of
  that group is open. A run is open from its start line to its first end line
  (E end, F planned failure, C cancelled); a run that never wrote one is open
  until the ``kill -9`` of its process. The overlap is *fenced*, not a
  violation, when the earlier run's end line is stale (the fenced journal
  refused it: its token had lost the group, so its effect was refused, and a
  run that ends with a cancellation did nothing after losing its lease), or
  when a start is stale. It is a violation when the earlier run was still
  fresh at its end (two tokens held the group), or was open until a kill
  (the group was handed over while its holder lived).
  But a stale end by a process that was never stopped is a violation of its
  own ("not stopped in time": the consumer must cancel a handler whose lease
  it cannot renew before another consumer can take its group), unless it is
  a cancellation whose record was delayed by Redis being away (Redis went
  away during the run, or the record landed in the backlog of writes that
  Redis processes in the first BACKLOG_MS after it comes back).
- **order**: within a group, fresh starts come in enqueue order (a task never
  starts again after a later task of its group started), and a task first
  starts after the run that made its predecessor succeed had ended.
- **duplicate** (at-least-once, not more): a task that runs again after a run
  of it completed (fresh E) is explained only by a fault in between that can
  lose an acknowledgement: a kill or SIGSTOP of that run's process, a Redis
  restart, dropped connections. Re-runs after a cancelled, stale, killed or
  planned-failure run are explained by it, and counted by cause.
- **attempts**: a task's attempt number grows with every run, except after a
  graceful hand-back (SIGTERM), which does not count the attempt. A handler
  still running when the grace period ends is cancelled and handed back,
  even if its last write landed just before: its re-run is explained.
- **journal**: the run whose token the task's hash records as applied has a
  fresh start and a fresh E; every run ends; each sequence number has one id.
  With ``lossy_restarts`` (the server's AOF is fsynced once a second), a
  restart may lose the journal's last acknowledged lines, while a consumer's
  unanswered call sent again after the restart lands: a run with no end
  line whose process lived on ends at the first restart after its start
  (``L``, and its task's success by its token stands), and a line of a
  token whose start was lost is counted, not judged (``lost_lines``).

Figures: recovery time after each kill of a run's process until its task
starts again (server ms), whether it was the first task of its group to start
again, and with attempt + 1; runs caught by SIGSTOP and how they ended.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from aiogroupq.testing._journal import GroupWatch

RUN_KINDS: Final = frozenset({"S", "E", "F", "C"})
END_KINDS: Final = frozenset({"E", "F", "C"})
INF: Final = 1 << 62
#: how long after Redis comes back (restart, SIGCONT) the writes it kept
#: waiting may still be landing
BACKLOG_MS: Final = 300


@dataclass(frozen=True, slots=True)
class Event:
    """One journal line."""

    clock: int
    ms: int
    fresh: bool
    kind: str
    fields: tuple[str, ...]

    @property
    def pid(self) -> int:
        return int(self.fields[0]) if self.fields and self.fields[0] != "-" else -1

    @property
    def arg(self) -> str:
        return self.fields[1] if len(self.fields) > 1 else "-"


def parse(lines: Iterable[bytes | str]) -> list[Event]:
    """Journal lines to events, in clock order."""
    events = []
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        clock, ms, fresh, kind, *rest = line.split(" ")
        events.append(Event(int(clock), int(ms), fresh == "1", kind, tuple(rest)))
    events.sort(key=lambda e: e.clock)
    return events


@dataclass(slots=True)
class Run:
    """One claim of a task (one fencing token) as the journal saw it."""

    token: str
    task_id: str
    seq: int
    group: str | None
    gseq: int
    attempt: int
    pid: int
    name: str
    start: Event
    end: Event | None = None
    # E F C, K (killed while open), L (end line lost with a restart), ? (never
    # ended)
    end_kind: str = "?"
    end_clock: int = INF
    end_ms: int = INF
    # A cancellation recorded after the run's end line: the handler was
    # cancelled while that write's reply was on its way (the write landed).
    cancel_clock: int = 0

    @property
    def completed(self) -> bool:
        """Ended with a fresh E: its success would have been applied. (A run
        whose end line a restart lost is judged by what the queue applied.)"""
        if self.end_kind == "L":
            return True
        return self.end is not None and self.end_kind == "E" and self.end.fresh

    def describe(self) -> str:
        end = (
            f"{self.end_kind}@{self.end_clock}"
            + ("" if self.end is None or self.end.fresh else "(stale)")
            if self.end_clock < INF
            else "open"
        )
        return (
            f"task {self.seq} ({self.group or 'ungrouped'}#{self.gseq}) attempt "
            f"{self.attempt} token {self.token} pid {self.pid} "
            f"S@{self.start.clock}{'' if self.start.fresh else '(stale)'}-{end}"
        )


@dataclass(frozen=True, slots=True)
class Spec:
    """An enqueued task."""

    task_id: str
    group: str | None
    gseq: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """A task's state after the run, and the token whose outcome was applied."""

    state: str | None
    applied_token: str | None


@dataclass
class Verdict:
    """Everything the oracle found; :attr:`violations` must be empty."""

    enqueued: int = 0
    succeeded: int = 0
    runs: int = 0
    lost: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    late_ends: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    fenced_overlaps: Counter[str] = field(default_factory=Counter)
    reruns: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    stale_writes: int = 0
    lost_lines: int = 0
    fenced_runs: int = 0
    recovery_same: list[float] = field(default_factory=list)
    recovery_new: list[float] = field(default_factory=list)
    interrupted: int = 0
    resumed_first: int = 0
    attempt_plus_one: int = 0
    stalled_runs: int = 0
    stalled_taken_over: int = 0
    stalled_cancelled: int = 0
    stalled_refused: int = 0
    cancel_after_cont_ms: list[float] = field(default_factory=list)
    terminated_open: int = 0
    handed_back: int = 0
    finished_in_grace: int = 0

    @property
    def violations(self) -> list[str]:
        return [
            *(f"lost: {v}" for v in self.lost),
            *(f"order: {v}" for v in self.order),
            *(f"overlap: {v}" for v in self.overlaps),
            *(f"not stopped in time: {v}" for v in self.late_ends),
            *(f"duplicate: {v}" for v in self.duplicates),
            *(f"attempts: {v}" for v in self.attempts),
            *(f"journal: {v}" for v in self.journal),
        ]

    @property
    def recovery(self) -> list[float]:
        return sorted(self.recovery_same + self.recovery_new)


@dataclass(slots=True)
class _Windows:
    """Fault marks by process and globally."""

    kills: dict[int, list[Event]] = field(default_factory=lambda: defaultdict(list))
    stops: dict[int, list[tuple[int, int, Event, Event | None]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    terms: dict[int, Event] = field(default_factory=dict)
    restarts: list[tuple[int, int]] = field(default_factory=list)
    ups: list[int] = field(default_factory=list)  # server ms Redis came back
    drops: list[int] = field(default_factory=list)
    #: partitions and pauses: a mark when they begin and one when they end
    cutoffs: list[tuple[int, int]] = field(default_factory=list)

    def killed_between(self, pid: int, lo: int, hi: int) -> bool:
        return any(lo < k.clock <= hi for k in self.kills.get(pid, ()))

    def stopped_between(self, pid: int, lo: int, hi: int) -> bool:
        return any(p < hi and q > lo for p, q, _, _ in self.stops.get(pid, ()))

    def restart_between(self, lo: int, hi: int) -> bool:
        return any(down < hi and up > lo for down, up in self.restarts)

    def in_backlog(self, ms: int) -> bool:
        """Landed within BACKLOG_MS after Redis came back: a write sent while
        it was away, delayed by it."""
        return any(0 <= ms - up <= BACKLOG_MS for up in self.ups)

    def drop_between(self, lo: int, hi: int) -> bool:
        # A partition or pause explains what overlaps it, even a run whose
        # start was journaled after it began (the claim's reply was on its
        # way; the journal has its own connection, outside the proxy).
        return any(lo < d < hi for d in self.drops) or any(
            begin < hi and end > lo for begin, end in self.cutoffs
        )

    def terminating(self, pid: int, clock: int) -> bool:
        term = self.terms.get(pid)
        return term is not None and term.clock < clock


def _windows(events: list[Event]) -> _Windows:
    w = _Windows()
    open_stop: dict[int, Event] = {}
    open_cutoff: dict[str, int] = {}
    down: int | None = None
    last = events[-1].clock if events else 0
    for e in events:
        if e.kind == "K":
            w.kills[e.pid].append(e)
        elif e.kind == "P":
            open_stop[e.pid] = e
        elif e.kind == "Q" and e.pid in open_stop:
            p = open_stop.pop(e.pid)
            w.stops[e.pid].append((p.clock, e.clock, p, e))
        elif e.kind == "T":
            w.terms.setdefault(e.pid, e)
        elif e.kind == "RD":
            down = e.clock
        elif e.kind == "RU" and down is not None:
            w.restarts.append((down, e.clock))
            w.ups.append(e.ms)
            down = None
        elif e.kind == "D" and e.arg in ("partition", "pause"):
            if e.arg in open_cutoff:
                w.cutoffs.append((open_cutoff.pop(e.arg), e.clock))
            else:
                open_cutoff[e.arg] = e.clock
        elif e.kind == "D":
            w.drops.append(e.clock)
    for pid, p in open_stop.items():
        w.stops[pid].append((p.clock, last + 1, p, None))
    if down is not None:
        w.restarts.append((down, last + 1))
    w.cutoffs += [(begin, last + 1) for begin in open_cutoff.values()]
    return w


def _runs(events: list[Event], w: _Windows, v: Verdict, lossy: bool) -> dict[str, Run]:
    runs: dict[str, Run] = {}
    for e in events:
        if e.kind not in RUN_KINDS:
            continue
        pid, name, task_id, seq, group, gseq, attempt, token = e.fields
        if not e.fresh:
            v.stale_writes += 1
        if e.kind == "S":
            if token in runs:
                v.journal.append(f"token {token} started twice")
                continue
            runs[token] = Run(
                token,
                task_id,
                int(seq),
                None if group == "-" else group,
                int(gseq),
                int(attempt),
                int(pid),
                name,
                e,
            )
            continue
        run = runs.get(token)
        if run is None:
            if lossy and w.restarts:
                v.lost_lines += 1  # its start line may be what a restart lost
            elif e.kind != "C":  # a cancellation may precede its start's write
                v.journal.append(f"{e.kind} of token {token} (task {seq}) not started")
            continue
        if e.kind == "C" and not run.cancel_clock:
            run.cancel_clock = e.clock
        if run.end is None:
            run.end, run.end_kind = e, e.kind
            run.end_clock, run.end_ms = e.clock, e.ms
    for run in runs.values():
        if run.end is not None:
            continue
        kill = next(
            (k for k in w.kills.get(run.pid, ()) if k.clock > run.start.clock), None
        )
        restart = next((down for down, _ in w.restarts if down > run.start.clock), None)
        if kill is not None:
            run.end_kind, run.end_clock, run.end_ms = "K", kill.clock, kill.ms
        elif lossy and restart is not None:
            run.end_kind, run.end_clock = "L", restart
            v.lost_lines += 1
        else:
            v.journal.append(f"run never ended: {run.describe()}")
    return runs


def _handed_back(run: Run, w: _Windows) -> bool:
    """Cancelled by its consumer's graceful exit (grace period over): handed
    back, uncounted, even if its last write landed before the cancellation."""
    return bool(run.cancel_clock) and w.terminating(run.pid, run.cancel_clock)


def _explain(run: Run, nxt: Run, w: _Windows) -> str | None:
    """Why *nxt* may run the task again after *run*; None if nothing does."""
    hi = nxt.start.clock
    if run.end_kind == "K" or w.killed_between(run.pid, run.start.clock, hi):
        return "kill"
    if w.stopped_between(run.pid, run.start.clock, hi):
        return "stall"
    if _handed_back(run, w):
        return "handback"
    if w.restart_between(run.start.clock, hi):
        return "restart"
    if w.drop_between(run.start.clock, hi):
        return "drop"
    if run.end_kind == "F":
        return "planned failure"
    if run.end_kind == "C" or (run.end is not None and not run.end.fresh):
        return "lease lost"
    return None


def judge(
    lines: Iterable[bytes | str],
    specs: Mapping[int, Spec],
    finals: Mapping[str, Outcome],
    *,
    lossy_restarts: bool = False,
) -> Verdict:
    """Check one run's journal; see the module's docstring for the rules.
    *lossy_restarts*: the server's AOF is fsynced once a second, so a restart
    may lose acknowledged journal lines."""
    events = parse(lines)
    v = Verdict(enqueued=len(specs))
    w = _windows(events)
    for e in events:
        if e.kind not in RUN_KINDS and e.arg != "final":
            v.faults[e.kind] += 1
    runs = _runs(events, w, v, lossy_restarts)
    v.runs = len(runs)

    by_task: dict[str, list[Run]] = defaultdict(list)
    for run in sorted(runs.values(), key=lambda r: r.start.clock):
        by_task[run.task_id].append(run)
        spec = specs.get(run.seq)
        if spec is None or spec.task_id != run.task_id:
            v.journal.append(
                f"task {run.seq} ran as {run.task_id}, enqueued as "
                f"{spec.task_id if spec else None} (duplicate enqueue?)"
            )

    # -- lost, and the run that made each task succeed ----------------------
    success: dict[str, Run] = {}
    for seq, spec in sorted(specs.items()):
        final = finals.get(spec.task_id, Outcome(None, None))
        if final.state != "succeeded":
            v.lost.append(f"task {seq} ({spec.task_id}) ended {final.state!r}")
            continue
        v.succeeded += 1
        applied = runs.get(final.applied_token or "")
        if applied is None and lossy_restarts and w.restarts:
            v.lost_lines += 1  # the run's start line went with a restart
        elif applied is None or applied.task_id != spec.task_id:
            v.journal.append(
                f"task {seq} succeeded with token {final.applied_token}, "
                "which never started it"
            )
        elif not (applied.completed and applied.start.fresh):
            v.journal.append(
                f"task {seq} succeeded by a run that did not complete: "
                f"{applied.describe()}"
            )
        else:
            success[spec.task_id] = applied

    # -- group exclusion and order --------------------------------------------
    by_group: dict[str, list[Run]] = defaultdict(list)
    for run in sorted(runs.values(), key=lambda r: r.start.clock):
        if run.group is not None:
            by_group[run.group].append(run)
    _group_rules(by_group, w, v)
    # A task first starts after the run that made its predecessor succeed ended.
    tasks_of: dict[str, list[Spec]] = defaultdict(list)
    for spec in specs.values():
        if spec.group is not None:
            tasks_of[spec.group].append(spec)
    for group in by_group:
        ordered = sorted(tasks_of[group], key=lambda s: s.gseq)
        for before, after in itertools.pairwise(ordered):
            done = success.get(before.task_id)
            first = next(
                (r for r in by_task.get(after.task_id, ()) if r.start.fresh), None
            )
            if (
                done is not None
                and first is not None
                and first.start.clock < (done.end_clock)
            ):
                v.order.append(
                    f"{first.describe()} started before its predecessor's success "
                    f"{done.describe()} ended"
                )

    # -- attempts and re-runs (a run with a stale start never held the task:
    # it is fenced, and judged only by the overlap rule) -------------------
    for task_id, all_runs in by_task.items():
        done = success.get(task_id)
        task_runs = [r for r in all_runs if r.start.fresh]
        v.fenced_runs += len(all_runs) - len(task_runs)
        for prev, nxt in itertools.pairwise(task_runs):
            if nxt.attempt < prev.attempt or (
                nxt.attempt == prev.attempt and not _handed_back(prev, w)
            ):
                v.attempts.append(f"{nxt.describe()} after {prev.describe()}")
        for run in task_runs:
            if run is done:
                continue
            if done is not None and run.start.clock > done.end_clock:
                v.duplicates.append(
                    f"{run.describe()} ran after {done.describe()} succeeded"
                )
                continue
            later = [r for r in task_runs if r.start.clock > run.start.clock]
            if not later:
                continue  # the task's last run (its success, or it was lost)
            cause = _explain(run, later[0], w)
            if cause is None:
                v.duplicates.append(
                    f"{later[0].describe()} re-ran {run.describe()} with no fault"
                )
            elif cause != "planned failure":
                v.reruns[cause] += 1

    # -- recovery after kills ---------------------------------------------------
    for pid, kills in w.kills.items():
        for kill in kills:
            mode = kill.arg
            for run in runs.values():
                if not (
                    run.pid == pid
                    and run.end_kind == "K"
                    and run.end_clock == kill.clock
                    and run.start.fresh
                ):
                    continue
                v.interrupted += 1
                again = next(
                    (
                        r
                        for r in by_task[run.task_id]
                        if r.start.clock > kill.clock and r.start.fresh
                    ),
                    None,
                )
                if again is None:
                    v.journal.append(f"never ran again after a kill: {run.describe()}")
                    continue
                seconds = (again.start.ms - kill.ms) / 1000
                (v.recovery_same if mode == "same" else v.recovery_new).append(seconds)
                if again.attempt == run.attempt + 1:
                    v.attempt_plus_one += 1
                if run.group is None:
                    v.resumed_first += 1
                    continue
                first = next(
                    (
                        r
                        for r in by_group[run.group]
                        if r.start.clock > kill.clock and r.start.fresh
                    ),
                    None,
                )
                if first is again:
                    v.resumed_first += 1
                else:
                    v.order.append(
                        f"after the kill of pid {pid}, {first and first.describe()} "
                        f"started before the interrupted {run.describe()}"
                    )

    # -- SIGSTOP and SIGTERM ----------------------------------------------------
    for pid, stops in w.stops.items():
        for p_clock, _, _, q_event in stops:
            for run in runs.values():
                if run.pid != pid or not (run.start.clock < p_clock < run.end_clock):
                    continue
                v.stalled_runs += 1
                # Taken over: another run of the task started while this one
                # was stalled or still open. (A run that starts after this one
                # ended is a re-run the stall explains, not a take-over: e.g.
                # this one wrote while its token still owned the task, then
                # its outcome was refused because its lease had run out.)
                taken = any(
                    r is not run
                    and p_clock < r.start.clock < run.end_clock
                    and r.start.fresh
                    for r in by_task[run.task_id]
                )
                if not taken:
                    continue
                v.stalled_taken_over += 1
                if run.end_kind == "C":
                    v.stalled_cancelled += 1
                    if q_event is not None:
                        v.cancel_after_cont_ms.append(float(run.end_ms - q_event.ms))
                elif run.end is not None and not run.end.fresh:
                    v.stalled_refused += 1
    for pid, term in w.terms.items():
        for run in runs.values():
            if run.pid == pid and run.start.clock < term.clock < run.end_clock:
                v.terminated_open += 1
                if _handed_back(run, w):
                    v.handed_back += 1
                elif run.completed or run.end_kind == "F":
                    v.finished_in_grace += 1
    return v


def _group_rules(by_group: Mapping[str, list[Run]], w: _Windows, v: Verdict) -> None:
    """Exclusion and order within each group, followed with the library's
    group-order checker along the runs' starts and ends (a run ends at its
    first end line, or at the kill of its process). A stale start takes part
    in exclusion (its overlaps are fenced), not in order."""
    fenced: set[str] = set()  # fenced overlaps count each overlapped run once
    watch: GroupWatch[str, Run] = GroupWatch()
    for group, group_runs in by_group.items():
        timeline = [(r.start.clock, True, r) for r in group_runs]
        timeline += [(r.end_clock, False, r) for r in group_runs if r.end_clock < INF]
        timeline.sort(key=lambda t: t[0])
        for _, starts, run in timeline:
            if not starts:
                watch.close(group, run.token)
                continue
            for earlier in watch.open(group, run.token, run):
                _classify_overlap(earlier, run, w, v, fenced)
            if not run.start.fresh:
                continue
            reached = watch.place(group, run.gseq, run)
            if reached is not None and run.gseq < reached.position:
                v.order.append(
                    f"{run.describe()} started after {reached.run.describe()}"
                )


def _classify_overlap(
    a: Run, b: Run, w: _Windows, v: Verdict, fenced: set[str]
) -> None:
    """*b* started while *a*, of the same group, was open."""
    if not (a.start.fresh and b.start.fresh):
        stale = a if not a.start.fresh else b
        if stale.token not in fenced:
            fenced.add(stale.token)
            v.fenced_overlaps["stale start"] += 1
        return
    if a.end_kind == "K":
        v.overlaps.append(
            f"{b.describe()} started while {a.describe()} was open until its kill"
        )
    elif a.end_kind == "L":
        v.overlaps.append(
            f"{b.describe()} started while {a.describe()} was open (its end line "
            "went with a restart)"
        )
    elif a.end is None:
        v.overlaps.append(f"{b.describe()} started while {a.describe()} never ended")
    elif a.end.fresh:
        v.overlaps.append(
            f"{b.describe()} started while {a.describe()} still held the group"
        )
    elif a.token not in fenced:
        fenced.add(a.token)
        if w.stopped_between(a.pid, a.start.clock, a.end_clock):
            v.fenced_overlaps["stalled (SIGSTOP)"] += 1
        elif a.end_kind == "C" and (
            w.restart_between(a.start.clock, a.end_clock) or w.in_backlog(a.end_ms)
        ):
            # Redis was away: the cancellation's record could only land late
            # (with its start, maybe: both then land in the backlog).
            v.fenced_overlaps["late cancellation record"] += 1
        else:
            # Fenced, but the handler was still running (to its end, or until
            # it was cancelled) after another took its group, although its
            # process never stalled: the consumer did not stop it in time.
            v.late_ends.append(f"{b.describe()} started while {a.describe()} still ran")
