"""A throwaway server dies with what started it: the pytest plugin's session
server when the test process is killed, the demo's when the demo is
(``ServerProcess(die_with_parent=True)``, Linux only). Killed with
``kill -9``, neither could stop its server, which stayed behind, adopted by
init."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import anyio
import pytest
import redis.asyncio

ROOT = Path(__file__).resolve().parents[1]
#: liveness only: how long a killed owner's server may take to go
PATIENCE = 30.0

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the kill with the parent is Linux's"
)


def _alive(pid: int) -> bool:
    """Whether *pid* runs (a zombie waiting for its new parent does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def _gone(pid: int) -> bool:
    """Wait up to PATIENCE for *pid* to end; kill it if it does not (it is
    a server our test started), and say whether it ended by itself."""
    with anyio.move_on_after(PATIENCE):
        while _alive(pid):
            await anyio.sleep(0.05)
        return True
    os.kill(pid, signal.SIGKILL)
    return False


def _environment() -> dict[str, str]:
    """This run's environment without what points the inner run at this
    run's server, xdist or addopts."""
    return {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PYTEST_") and name != "REDIS_URL"
    }


CRASHING_TEST = """
import os
import signal


def test_crash(aiogroupq_server):
    with open(os.environ["SERVER_PID_FILE"], "w") as out:
        out.write(str(aiogroupq_server.process.pid))
    os.kill(os.getpid(), signal.SIGKILL)
"""


async def test_the_plugin_s_server_dies_with_a_killed_test_process(
    tmp_path: Path,
) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_crash.py").write_text(CRASHING_TEST)
    pid_file = tmp_path / "server.pid"
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(
            [sys.executable, "-m", "pytest", "-p", "aiogroupq.testing.pytest_plugin",
             "-p", "no:cacheprovider", "-p", "no:randomly", "test_crash.py"],
            check=False,
            cwd=tmp_path,
            env={**_environment(), "SERVER_PID_FILE": str(pid_file)},
        )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stdout.decode()
    pid = int(pid_file.read_text())
    assert await _gone(pid), "the session's server outlived the test process"


async def test_the_demo_s_server_dies_with_a_killed_demo() -> None:
    argv = [sys.executable, "-m", "aiogroupq", "demo", "--tasks", "20000"]
    argv += ["--processes", "1"]
    async with await anyio.open_process(
        argv, cwd=ROOT, env=_environment(), stderr=None
    ) as demo:
        assert demo.stdout is not None
        seen = b""
        with anyio.fail_after(120):  # liveness only
            while (found := re.search(rb"\(throwaway\) at (\S+)\n", seen)) is None:
                seen += await demo.stdout.receive()
        async with redis.asyncio.Redis.from_url(found[1].decode()) as client:
            pid = int((await client.info("server"))["process_id"])
        demo.kill()
        await demo.wait()
    assert await _gone(pid), "the demo's server outlived the demo"
