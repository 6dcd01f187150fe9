"""What the command line prints of stored text that carries terminal
control characters: a group name, a task type, a handler's error message and
traceback, a consumer name, each stored through the library as a user's code
would, then shown by ``python -m aiogroupq`` as a real process. Human output
shows every control character escaped (``\\x1b``), tracebacks keep their
line breaks, printable Unicode stays as it is; ``--json`` keeps the values
exact, escaped the JSON way.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq import TaskState
from aiogroupq._inspect.printable import json_printable, printable

if TYPE_CHECKING:
    from ._spawn import Spawn

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "hostile"
#: an OSC title change rung with BEL, a CSI recolour, a CR that overwrites
#: the line, a C1 CSI, a bidirectional override; and printable text
EVIL = "\x1b]0;owned\x07\x1b[31mred\rCR\x9b2J\u202egnp.exe"
#: a command line argument cannot hold a NUL: the group has none
GROUP = f"g{EVIL}-日本"
TYPE = f"t\x00{EVIL}"
CONSUMER = f"c\x00{EVIL}"
ERROR = f"boom\x00{EVIL}\nsecond line"
#: bytes a terminal acts on: C0 but the line break, DEL, and C1 (U+0080 to
#: U+009F, two bytes each in UTF-8)
_C0 = {b for b in range(0x20) if b != 0x0A} | {0x7F}


def control_bytes(out: bytes) -> dict[str, int]:
    """How many of each control character *out* holds, by name."""
    found: dict[str, int] = {}
    for b in out:
        if b in _C0:
            name = {0x1B: "ESC", 0x07: "BEL", 0x0D: "CR", 0x00: "NUL"}.get(b, hex(b))
            found[name] = found.get(name, 0) + 1
    c1 = out.decode(errors="replace")
    for char in c1:
        if 0x80 <= ord(char) <= 0x9F or char in "\u202e\u2066\u2067\u2068\u2069":
            found[f"U+{ord(char):04X}"] = found.get(f"U+{ord(char):04X}", 0) + 1
    return found


async def run_cli(url: str, *args: str) -> tuple[int, bytes, bytes]:
    argv = [sys.executable, "-m", "aiogroupq", *args, "--queue", QUEUE]
    argv += ["--redis-url", url]
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(argv, check=False, cwd=ROOT)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
async def stored(redis_client: redis.asyncio.Redis) -> str:
    """A dead letter of group GROUP and type TYPE, failed by a handler of
    consumer CONSUMER with ERROR; returns its id."""

    async def handler() -> None:
        raise ValueError(ERROR)

    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_client, queue=QUEUE, name=CONSUMER, handlers={TYPE: handler}
        ),
    ):
        task_id = await producer.enqueue(TYPE, group=GROUP, max_attempts=1)
        with anyio.fail_after(30):
            while await producer.status(task_id) is not TaskState.DEAD:
                await anyio.sleep(0.01)
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        # Two more wait, the second in the group's line: "groups" lists it.
        await producer.enqueue(TYPE, group=GROUP)
        await producer.enqueue(TYPE, group=GROUP)
    return task_id


COMMANDS: Sequence[Sequence[str]] = (
    ["dead", "list"], ["dead", "show", "{id}"], ["task", "{id}"],
    ["group", GROUP], ["groups"], ["stats"],
)  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
async def test_human_output_escapes_control_characters(
    redis_url: str, stored: str, command: Sequence[str]
) -> None:
    args = [a.replace("{id}", stored) for a in command]
    code, out, err = await run_cli(redis_url, *args)
    found = control_bytes(out)
    print(f"aiogroupq {printable(' '.join(command[:2]))}: control characters {found}")  # noqa: T201
    assert code == 0, err
    assert found == {}
    assert control_bytes(err) == {}
    text = out.decode()
    if command[0] in ("dead", "task", "group", "groups"):
        assert "\\x1b]0;owned\\x07" in text  # shown, escaped
        assert "日本" in text or command[0] != "group"  # printable Unicode kept
    if command[:2] == ["dead", "show"] or command[0] == "task":
        # The traceback keeps its lines: the error's second line is one.
        assert "\n    second line" in text or "\n  second line" in text, text
        assert printable(TYPE) in text


@pytest.mark.parametrize("command", COMMANDS[:5], ids=lambda c: " ".join(c[:2]))
async def test_json_keeps_the_values_exactly(
    redis_url: str, stored: str, command: Sequence[str]
) -> None:
    args = [a.replace("{id}", stored) for a in command]
    code, out, _ = await run_cli(redis_url, *args, "--json")
    found = control_bytes(out)
    shown = printable(" ".join(command[:2]))
    print(f"aiogroupq {shown} --json: control characters {found}")  # noqa: T201
    assert code == 0
    assert found == {}
    # The values themselves, exactly as stored.
    assert GROUP in strings(json.loads(out)) or command[0] == "dead"
    assert command[0] != "dead" or TYPE in strings(json.loads(out))


def strings(data: object) -> set[str]:
    """Every string value in decoded JSON."""
    if isinstance(data, str):
        return {data}
    if isinstance(data, dict):
        return set().union(*(strings(v) for v in data.values()))
    if isinstance(data, list):
        return set().union(*(strings(v) for v in data))
    return set()


async def test_a_live_consumers_name_is_shown_escaped(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async def handler() -> None:
        pass

    async with aiogroupq.Consumer(
        redis_client, queue=QUEUE, name=CONSUMER, handlers={"t": handler}
    ):
        code, out, err = await run_cli(redis_url, "consumers")
    found = control_bytes(out)
    print(f"aiogroupq consumers: control characters {found}")  # noqa: T201
    assert code == 0, err
    assert found == {}
    assert printable(CONSUMER) in out.decode()


def test_printable_keeps_printable_text_and_is_idempotent() -> None:
    assert printable("plain — 日本 ✓") == "plain — 日本 ✓"
    once = printable(ERROR)
    assert once.isprintable()
    assert printable(once) == once
    assert printable("a\nb\rc", keep="\n") == "a\nb\\rc"
    text = json.dumps({"k": EVIL}, ensure_ascii=False)
    assert json.loads(json_printable(text)) == {"k": EVIL}
    assert json_printable(text).replace("\n", "").isprintable()


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_worker_logs_escape_control_characters(
    redis_client: redis.asyncio.Redis, redis_url: str, spawn: Spawn, log_format: str
) -> None:
    # A handler's error text reaches the log as the handler wrote it.
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        task_id = await producer.enqueue(
            "fail_with", ERROR, group=GROUP, max_attempts=1
        )
    worker = spawn(
        "worker", "tests.example_app:echo_failures", "--queue", QUEUE,
        "--redis-url", redis_url, "--log-format", log_format,
    )  # fmt: skip
    await worker.wait_for_output("dead-lettered")
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0, worker.output
    found = control_bytes(worker.output.encode())
    print(f"aiogroupq worker --log-format {log_format}: control characters {found}")  # noqa: T201
    assert found == {}
    assert task_id in worker.output
    if log_format == "json":  # still the exact text, escaped the JSON way
        (line,) = [
            json.loads(x)
            for x in worker.output.splitlines()
            if task_id in x and "dead-lettered" in x
        ]
        assert ERROR in line["message"]
