"""Static checks of the public types (mypy runs over tests/; never executed).

``Producer.result`` keeps the caller's type: a class passed as ``result_type``
is the return type, and without one the result is ``Any``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_type

import msgspec

import aiogroupq


class Report(msgspec.Struct):
    rows: int


@dataclass
class Summary:
    total: float


async def result_types(producer: aiogroupq.Producer, task_id: str) -> None:
    assert_type(await producer.result(task_id), Any)
    assert_type(await producer.result(task_id, timeout=5.0), Any)
    assert_type(await producer.result(task_id, result_type=Report), Report)
    assert_type(await producer.result(task_id, result_type=Summary), Summary)
    assert_type(await producer.result(task_id, result_type=int), int)
    assert_type(
        await producer.result(task_id, timeout=1.0, result_type=list[int]), list[int]
    )
    # A union is no class: msgspec decodes into it, the checker sees Any.
    assert_type(await producer.result(task_id, result_type=int | None), Any)


async def other_public_types(
    producer: aiogroupq.Producer, admin: aiogroupq.Admin, task_id: str
) -> None:
    assert_type(await producer.enqueue("t", {"a": 1}, group="g"), str)
    assert_type(await producer.enqueue_many([aiogroupq.Task("t")]), list[str])
    assert_type(await producer.status(task_id), aiogroupq.TaskState | None)
    assert_type(await producer.status_many([task_id]), list[aiogroupq.TaskState | None])
    assert_type(await producer.cancel(task_id), bool)
    assert_type(await admin.dead_letters(), list[aiogroupq.DeadLetter])
    assert_type(await admin.requeue_dead(task_id), int)
    assert_type(await admin.purge_dead(all=True), int)
    assert_type(await admin.release_group("g"), bool)
    assert_type(aiogroupq.current_task(), aiogroupq.TaskInfo)
    assert_type(
        await aiogroupq.check_queue("redis://localhost", producer.queue),
        list[aiogroupq.Problem],
    )
