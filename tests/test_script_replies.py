"""What the scripts answer (``_store/replies.py``): the codes keep the
integers the Lua returns, codes of different scripts never stand for one
another, and each refusal or code becomes the error users see."""

from __future__ import annotations

import pytest
from redis.exceptions import OutOfMemoryError, ResponseError

from aiogroupq._store.replies import (
    CancelCode,
    FinishCode,
    GroupCorruptRefusal,
    GroupFullRefusal,
    HeartbeatCode,
    NotReplicatedRefusal,
    StaleLayoutRefusal,
    public_error,
    refusal,
)
from aiogroupq.errors import (
    CorruptQueueError,
    GroupFullError,
    NotReplicatedError,
    QueueFullError,
    TaskNotFoundError,
)


def test_codes_are_the_integers_the_lua_returns() -> None:
    # finish.lua, heartbeat.lua and cancel.lua document these values.
    assert [int(c) for c in FinishCode] == [0, 1, 2, 3, 4, 5]
    assert [c.name for c in FinishCode] == [
        "LEASE_LOST",
        "APPLIED",
        "DUPLICATE",
        "APPLIED_AS_CANCEL",
        "GROUP_DAMAGED",
        "TASK_DAMAGED",
    ]
    assert [c.name for c in HeartbeatCode] == ["LOST", "ALIVE", "CANCEL_REQUESTED"]
    assert [c.name for c in CancelCode] == [
        "NOT_FOUND",
        "CANCELLED",
        "REQUESTED",
        "FINISHED",
    ]


def test_a_code_is_read_by_its_own_script() -> None:
    # 0 is an unknown task for cancel, a lost lease for finish and heartbeat:
    # only the first is TaskNotFoundError.
    error = public_error(CancelCode.NOT_FOUND, "t1")
    assert isinstance(error, TaskNotFoundError)
    assert error.task_id == "t1"
    assert str(error) == "no task 't1' in this queue (unknown or expired)"
    assert public_error(FinishCode.LEASE_LOST, "t1") is None
    assert public_error(HeartbeatCode.LOST, "t1") is None
    for code in (*FinishCode, *HeartbeatCode, *CancelCode):
        if code is not CancelCode.NOT_FOUND:
            assert public_error(code, "t1") is None, code


def test_refusals_become_the_errors_users_see() -> None:
    full = public_error(GroupFullRefusal(0, 5, 5), "g")
    assert isinstance(full, GroupFullError)
    assert (full.group, full.size, full.cap) == ("g", 5, 5)
    corrupt = public_error(GroupCorruptRefusal(1), "{aiogroupq:q}:grp:g")
    assert isinstance(corrupt, CorruptQueueError)
    assert corrupt.key == "{aiogroupq:q}:grp:g"
    assert "a key of this group is damaged" in str(corrupt)
    late = public_error(NotReplicatedRefusal(["a", "b"], 0), replicas=1)
    assert isinstance(late, NotReplicatedError)
    assert (late.task_ids, late.acknowledged, late.required) == (["a", "b"], 0, 1)
    # routing sends a stale batch again: no user ever sees it
    assert public_error(StaleLayoutRefusal("8>12")) is None


def test_error_replies_that_stand_for_public_errors() -> None:
    damaged = public_error(ResponseError("aiogroupq corrupt {aiogroupq:q}:ready: x"))
    assert isinstance(damaged, CorruptQueueError)
    assert damaged.key == "{aiogroupq:q}:ready"
    full = public_error(OutOfMemoryError("command not allowed when used memory"))
    assert isinstance(full, QueueFullError)
    assert public_error(ResponseError("aiogroupq finish: malformed arguments")) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aiogroupq group-full 2 5 5", GroupFullRefusal(2, 5, 5)),
        ("aiogroupq group-corrupt 3", GroupCorruptRefusal(3)),
        ("aiogroupq stale 8>12", StaleLayoutRefusal("8>12")),
        ("aiogroupq corrupt {aiogroupq:q}:ready: x", None),
        ("aiogroupq enqueue: malformed arguments", None),
    ],
)
def test_enqueue_refusals_are_read_from_the_error_text(
    text: str, expected: Exception | None
) -> None:
    found = refusal(ResponseError(text))
    if expected is None:
        assert found is None
    else:
        assert found is not None
        assert type(found) is type(expected)
        assert found.args == expected.args
