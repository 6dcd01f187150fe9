"""``python -m aiogroupq ...`` as a child process, for the command-line tests.

The ``spawn`` fixture (``conftest.py``) starts them and kills whatever a
failed test left running.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
#: liveness only: how long anything may take before we call it hung
PATIENCE = 60.0
#: run ``argv[1:]`` with SIGINT ignored (kept across exec)
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


class Proc:
    """``python -m aiogroupq *args`` with its output in a file.

    :param env: the child's environment (default: ours)
    :param new_session: start it in a session of its own, like a shell job,
        so that a signal to our process group does not reach it
    :param sigint_ignored: start it with SIGINT ignored, as a shell without
        job control starts a background job (``cmd &`` in a script)
    """

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        new_session: bool = False,
        sigint_ignored: bool = False,
    ) -> None:
        self.log = log
        argv = [sys.executable, "-m", "aiogroupq", *args]
        if sigint_ignored:
            argv = [sys.executable, "-c", _SIGINT_IGNORED, *argv]
        with open(log, "wb") as out:
            self.popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=new_session,
            )

    @property
    def output(self) -> str:
        # Bytes decoded as they are: a text read would turn a \r into \n.
        return self.log.read_bytes().decode(errors="replace")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def alive(self) -> bool:
        return self.popen.poll() is None

    async def wait(self, timeout: float = PATIENCE) -> int:
        await poll(lambda: not self.alive(), timeout=timeout)
        return self.popen.wait()

    async def wait_for_output(self, needle: str, count: int = 1) -> None:
        await poll(lambda: self.output.count(needle) >= count, self)

    def kill(self) -> None:
        if self.alive():
            self.popen.kill()
            self.popen.wait()


#: the ``spawn`` fixture: ``spawn(*args)`` starts ``python -m aiogroupq *args``
Spawn = Callable[..., Proc]


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is *pid* (Linux ``/proc``)."""
    pids = [
        int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()
    ]
    return [child for child in pids if running(child) and _stat(child)[1] == pid]


def running(pid: int) -> bool:
    """Whether process *pid* exists and has not ended (a zombie, ended but
    not yet reaped by its parent, has ended; Linux ``/proc``)."""
    return _stat(pid)[0] not in ("", "Z", "X")


def _stat(pid: int) -> tuple[str, int]:
    """The state letter and parent pid of *pid* (``("", 0)`` if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "", 0
    # "pid (comm) S ppid ...": the fields after the last parenthesis.
    fields = stat.rpartition(")")[2].split()
    return fields[0], int(fields[1])


async def poll(
    check: Callable[[], bool | Awaitable[bool]],
    proc: Proc | None = None,
    *,
    timeout: float = PATIENCE,
) -> None:
    """Wait until *check* holds; fail if *proc* dies first or it takes forever."""
    with anyio.fail_after(timeout):
        while True:
            ok = check()
            if not isinstance(ok, bool):
                ok = await ok
            if ok:
                return
            assert proc is None or proc.alive(), proc.output
            await anyio.sleep(0.02)
