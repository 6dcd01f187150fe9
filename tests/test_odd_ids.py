"""Odd input to the lookups, and odd numbers stored in a task's hash: each is
an aiogroupq error (or an answer), never a bare ``TypeError``,
``UnicodeEncodeError`` or ``OverflowError``; and the command line shows
such a task in one page, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._store.keys import QueueKeys

if TYPE_CHECKING:
    from ._roles import Both

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "odd-ids"
KEYS = QueueKeys(QUEUE)

#: ids no enqueue returns, and what each lookup must make of them
ODD_IDS: list[tuple[object, str]] = [
    ("", "invalid"),
    (5, "invalid"),
    (None, "invalid"),
    (b"0123abcd", "invalid"),
    (["a"], "invalid"),
    ("\udcff", "invalid"),  # a lone surrogate: not encodable
    ("a\x00b", "missing"),
    ("x" * 100_000, "missing"),
    ("\x1b[31m", "missing"),
    ("9" * 400, "missing"),
    ("t:", "missing"),
]


@pytest.mark.parametrize(("task_id", "kind"), ODD_IDS, ids=lambda v: repr(v)[:12])
async def test_an_odd_id_is_a_typed_error_or_not_found(
    both: Both, task_id: Any, kind: str
) -> None:
    producer, admin = both
    await producer.enqueue("t")
    if kind == "invalid":
        # '' and 5 raised a bare TypeError, a surrogate a UnicodeEncodeError.
        with pytest.raises(aiogroupq.InvalidTaskError, match="task_id") as caught:
            await admin.task(task_id)
        assert caught.value.field == "task_id"
        assert isinstance(caught.value, TypeError)  # what it was before
        with pytest.raises(aiogroupq.InvalidTaskError, match="task_id"):
            await producer.status(task_id)
        with pytest.raises(aiogroupq.InvalidTaskError):
            await producer.status_many([task_id])
    else:
        with pytest.raises(aiogroupq.TaskNotFoundError):
            await admin.task(task_id)
        assert await producer.status(task_id) is None


#: stored numbers no script writes, by field of the task hash
ODD_NUMBERS = [
    ("a", "inf"), ("m", "1e400"), ("p", "-inf"), ("a", "nan"),
    ("ft", "1e400"), ("ft", "1e300"), ("ft", "nan"), ("ft", "-5e15"),
    ("dt", "1e30"), ("xp", "-1e30"), ("i", "1e400 1e400 t"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value"), ODD_NUMBERS)
async def test_odd_stored_numbers_still_show_the_task(
    both: Both,
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    field: str,
    value: str,
) -> None:
    producer, admin = both
    task_id = await producer.enqueue("t", group="g")
    await redis_client.hset(KEYS.task(task_id), field, value)
    # Admin.task raised OverflowError for "inf" in a counter.
    details = await admin.task(task_id)
    assert details.id == task_id
    argv = [sys.executable, "-m", "aiogroupq", "task", task_id, "--queue", QUEUE]
    with anyio.fail_after(120):  # liveness only
        done = await anyio.run_process(
            [*argv, "--redis-url", redis_url], check=False, cwd=ROOT
        )
    err = done.stderr.decode()
    print(f"{field}={value}: aiogroupq task exit {done.returncode}")  # noqa: T201
    assert "Traceback" not in err, err
    assert done.returncode == 0, err
