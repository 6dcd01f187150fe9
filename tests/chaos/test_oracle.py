"""The chaos oracle must be able to fail: synthetic histories, good and bad.

These run in the default test session (no server needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._oracle import Outcome, Spec, Verdict, judge


@dataclass
class History:
    """Builds journal lines; the clock advances by one per line."""

    lines: list[str] = field(default_factory=list)
    specs: dict[int, Spec] = field(default_factory=dict)
    finals: dict[str, Outcome] = field(default_factory=dict)

    def task(self, seq: int, group: str | None, gseq: int) -> None:
        self.specs[seq] = Spec(f"t{seq}", group, gseq)

    def run(
        self,
        kind: str,
        seq: int,
        token: int,
        *,
        attempt: int = 1,
        pid: int = 100,
        fresh: bool = True,
    ) -> None:
        spec = self.specs[seq]
        clock = len(self.lines) + 1
        self.lines.append(
            f"{clock} {clock * 10} {int(fresh)} {kind} {pid} c{pid} {spec.task_id} "
            f"{seq} {spec.group or '-'} {spec.gseq} {attempt} {token}"
        )

    def mark(self, kind: str, pid: int | str = "-", arg: str = "-") -> None:
        clock = len(self.lines) + 1
        self.lines.append(f"{clock} {clock * 10} 1 {kind} {pid} {arg}")

    def done(self, seq: int, token: int, state: str = "succeeded") -> None:
        self.finals[f"t{seq}"] = Outcome(state, str(token))

    def judge(self, *, lossy_restarts: bool = False) -> Verdict:
        return judge(self.lines, self.specs, self.finals, lossy_restarts=lossy_restarts)


def _two_in_a_group() -> History:
    h = History()
    h.task(0, "g", 0)
    h.task(1, "g", 1)
    return h


def test_a_clean_history_passes() -> None:
    h = _two_in_a_group()
    h.task(2, None, 0)
    h.run("S", 0, 1)
    h.run("S", 2, 2, pid=101)
    h.run("E", 0, 1)
    h.run("S", 1, 3)
    h.run("E", 2, 2, pid=101)
    h.run("E", 1, 3)
    for seq, token in ((0, 1), (1, 3), (2, 2)):
        h.done(seq, token)
    v = h.judge()
    assert v.violations == []
    assert (v.enqueued, v.succeeded, v.runs) == (3, 3, 3)


def test_two_fresh_runs_of_a_group_at_once_are_an_overlap() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1)
    h.run("S", 1, 2, pid=101)
    h.run("E", 0, 1)
    h.run("E", 1, 2, pid=101)
    h.done(0, 1)
    h.done(1, 2)
    v = h.judge()
    assert len(v.overlaps) == 1
    assert any("order" in x for x in v.violations)  # 1 began before 0 succeeded


def test_a_stalled_runs_refused_write_is_a_fenced_overlap() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.mark("P", 100)
    h.run("S", 0, 2, pid=101, attempt=2)  # took over after the lease expired
    h.mark("Q", 100)
    h.run("E", 0, 1, pid=100, fresh=False)  # the late write is refused
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    v = h.judge()
    assert v.violations == []
    assert v.fenced_overlaps["stalled (SIGSTOP)"] == 1
    assert (v.stalled_runs, v.stalled_taken_over, v.stalled_refused) == (1, 1, 1)
    assert v.reruns["stall"] == 1


def test_a_late_write_that_was_not_refused_is_an_overlap() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.mark("P", 100)
    h.run("S", 0, 2, pid=101, attempt=2)
    h.mark("Q", 100)
    h.run("E", 0, 1, pid=100)  # fresh: the group had two holders
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    assert len(h.judge().overlaps) == 1


def test_a_run_open_until_its_kill_must_not_be_overlapped() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.run("S", 0, 2, pid=101, attempt=2)
    h.mark("K", 100, "new")
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    assert len(h.judge().overlaps) == 1


def test_kill_recovery_is_measured_and_must_resume_first() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.mark("K", 100, "same")
    h.run("S", 0, 2, pid=101, attempt=2)
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    v = h.judge()
    assert v.violations == []
    assert (v.interrupted, v.resumed_first, v.attempt_plus_one) == (1, 1, 1)
    assert v.recovery_same == [0.01]  # one clock tick = 10 ms here

    bad = _two_in_a_group()
    bad.run("S", 0, 1, pid=100)
    bad.mark("K", 100, "new")
    bad.run("S", 1, 3, pid=101)  # a later task overtakes the interrupted one
    bad.run("E", 1, 3, pid=101)
    bad.run("S", 0, 2, pid=101, attempt=2)
    bad.run("E", 0, 2, pid=101, attempt=2)
    bad.done(0, 2)
    bad.done(1, 3)
    v = bad.judge()
    assert v.resumed_first == 0
    assert len(v.order) >= 2


def test_an_unfinished_task_is_lost() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1)
    h.run("E", 0, 1)
    h.done(0, 1)
    h.finals["t1"] = Outcome("queued", None)
    v = h.judge()
    assert len(v.lost) == 1
    assert "t1" in v.lost[0]


def test_a_second_complete_run_needs_a_fault_in_between() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("E", 0, 1)
    h.run("S", 0, 2, attempt=2)
    h.run("E", 0, 2, attempt=2)
    h.done(0, 2)
    assert len(h.judge().duplicates) == 1

    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("E", 0, 1)
    h.mark("RD")
    h.mark("RU")
    h.run("S", 0, 2, attempt=2)
    h.run("E", 0, 2, attempt=2)
    h.done(0, 2)
    v = h.judge()
    assert v.violations == []
    assert v.reruns["restart"] == 1


def test_a_partition_explains_a_run_it_overlaps() -> None:
    # The run starts after the partition's first mark (its claim's reply was
    # on its way) and its consumer cannot finish it: the lease expires and
    # the task runs again before the partition's end mark.
    for how, explained in (("partition", True), ("pause", True), ("reset", False)):
        h = History()
        h.task(0, "g", 0)
        h.mark("D", arg=how)
        h.run("S", 0, 1)
        h.run("E", 0, 1)
        h.run("S", 0, 2, attempt=2)
        h.run("E", 0, 2, attempt=2)
        h.mark("D", arg=how)
        h.done(0, 2)
        v = h.judge()
        assert (v.violations == []) == explained, (how, v.violations)


def test_running_again_after_success_is_a_duplicate() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("E", 0, 1)
    h.mark("K", 100, "new")
    h.run("S", 0, 2, attempt=2, pid=101)
    h.run("E", 0, 2, attempt=2, pid=101)
    h.done(0, 1)  # the first run's success was applied
    assert len(h.judge().duplicates) == 1


def test_an_attempt_is_counted_unless_handed_back() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("C", 0, 1)
    h.run("S", 0, 2, pid=101)  # same attempt, no graceful exit
    h.run("E", 0, 2, pid=101)
    h.done(0, 2)
    assert len(h.judge().attempts) == 1

    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.mark("T", 100, "fault")
    h.run("C", 0, 1)
    h.run("S", 0, 2, pid=101)
    h.run("E", 0, 2, pid=101)
    h.done(0, 2)
    v = h.judge()
    assert v.violations == []
    assert (v.terminated_open, v.handed_back) == (1, 1)


def test_a_success_the_journal_never_saw_complete_is_flagged() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("C", 0, 1)
    h.done(0, 1)
    assert len(h.judge().journal) == 1


def test_a_run_that_never_ends_is_flagged() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("S", 0, 2, attempt=2, pid=101)
    h.run("E", 0, 2, attempt=2, pid=101)
    h.done(0, 2)
    assert any("never ended" in x for x in h.judge().journal)


def test_a_task_run_under_another_id_is_a_duplicate_enqueue() -> None:
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.run("E", 0, 1)
    h.done(0, 1)
    h.lines.append(f"{len(h.lines) + 1} 0 1 S 100 c100 other 0 - 0 1 9")
    h.lines.append(f"{len(h.lines) + 1} 0 1 E 100 c100 other 0 - 0 1 9")
    assert any("duplicate enqueue" in x for x in h.judge().journal)


def test_a_cancelled_run_still_open_when_its_group_moved_on() -> None:
    """A stale cancellation with no outage: the handler still ran while
    another run of its group had started (not stopped in time)."""
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.run("S", 0, 2, pid=101, attempt=2)
    h.run("C", 0, 1, pid=100, fresh=False)
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    v = h.judge()
    assert len(v.late_ends) == 1
    assert not v.fenced_overlaps

    # The same, but Redis was away meanwhile: its record could only land late.
    h = _two_in_a_group()
    h.run("S", 0, 1, pid=100)
    h.mark("RD")
    h.mark("RU")
    h.run("S", 0, 2, pid=101, attempt=2)
    h.run("C", 0, 1, pid=100, fresh=False)
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    v = h.judge()
    assert v.violations == []
    assert v.fenced_overlaps["late cancellation record"] == 1


def test_a_handler_cancelled_at_the_end_of_the_grace_period_is_handed_back() -> None:
    """Its last write landed, then the grace period ended while its reply was
    on the way: handed back uncounted, and its re-run is no duplicate."""
    h = History()
    h.task(0, None, 0)
    h.run("S", 0, 1)
    h.mark("T", 100, "fault")
    h.run("E", 0, 1)
    h.run("C", 0, 1)
    h.run("S", 0, 2, pid=101)
    h.run("E", 0, 2, pid=101)
    h.done(0, 2)
    v = h.judge()
    assert v.violations == []
    assert (v.handed_back, v.reruns["handback"]) == (1, 1)

    h.lines = [x for x in h.lines if " T " not in x]  # no graceful exit: a bug
    assert len(h.judge().duplicates) == 1


def test_records_held_up_by_a_stalled_redis_land_late_together() -> None:
    """A run claimed just before Redis froze: its start and its cancellation
    both land after the thaw, behind another consumer's take-over."""
    h = _two_in_a_group()
    h.mark("RD")
    h.mark("RU")  # ms 20
    h.run("S", 0, 1, pid=100)  # ms 30: sent before the freeze
    h.run("S", 0, 2, pid=101, attempt=2)
    h.run("C", 0, 1, pid=100, fresh=False)  # ms 50, cancelled long before
    h.run("E", 0, 2, pid=101, attempt=2)
    h.run("S", 1, 3, pid=101)
    h.run("E", 1, 3, pid=101)
    h.done(0, 2)
    h.done(1, 3)
    v = h.judge()
    assert v.violations == []
    assert v.fenced_overlaps["late cancellation record"] == 1


def _end_lost_with_a_restart() -> History:
    """Task 0's end line went with a restart (AOF fsynced once a second);
    its finish, sent again after the restart, landed; task 1 of its group
    started after."""
    h = _two_in_a_group()
    h.run("S", 0, 1)
    h.mark("RD")
    h.mark("RU")
    h.run("S", 1, 2)
    h.run("E", 1, 2)
    h.done(0, 1)
    h.done(1, 2)
    return h


def test_an_end_line_lost_with_a_restart_is_counted_when_restarts_may_lose() -> None:
    v = _end_lost_with_a_restart().judge(lossy_restarts=True)
    assert v.violations == []
    assert v.lost_lines == 1


def test_an_end_line_missing_after_a_restart_is_flagged_when_nothing_is_lost() -> None:
    v = _end_lost_with_a_restart().judge()
    assert any("never ended" in x for x in v.journal)
    assert len(v.overlaps) == 1


def test_a_group_started_before_the_restart_that_lost_an_end_is_an_overlap() -> None:
    h = _two_in_a_group()
    h.run("S", 0, 1)
    h.run("S", 1, 2)  # before the restart: task 0 was still open
    h.mark("RD")
    h.mark("RU")
    h.run("E", 1, 2)
    h.done(0, 1)
    h.done(1, 2)
    v = h.judge(lossy_restarts=True)
    assert any("went with a restart" in x for x in v.overlaps)


def test_a_line_of_a_token_whose_start_was_lost_is_counted_when_restarts_may_lose() -> (
    None
):
    h = History()
    h.task(0, None, 0)
    h.mark("RD")
    h.mark("RU")
    h.run("E", 0, 1)
    h.done(0, 1)
    assert h.judge(lossy_restarts=True).violations == []
    assert h.judge(lossy_restarts=True).lost_lines == 2  # the E, and the success
    assert len(h.judge().journal) == 2
