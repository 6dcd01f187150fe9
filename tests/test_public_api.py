"""The public surface DESIGN.md pins: names, module paths, shipped files, states.

Users (and the acceptance checks) import these names; renaming or dropping one
is a breaking change, so each is pinned here explicitly rather than derived.
"""

from __future__ import annotations

import enum
import inspect
import math
from importlib.resources import files

import pytest

import aiogroupq

# Every name users may import from the package, and nothing else.
PUBLIC_NAMES = frozenset(
    {
        "AiogroupqError",
        "TaskExpiredError",
        "Rate",
        "QueueSettings",
        "GroupSettings",
        "GroupFullError",
        "CorruptQueueError",
        "BatchTooLargeError",
        "Admin",
        "AuthenticationError",
        "ConsumerInfo",
        "GroupInfo",
        "GroupPage",
        "GroupState",
        "GroupTask",
        "QueueStats",
        "TaskDetails",
        "StartEstimate",
        "ConfigurationError",
        "Consumer",
        "ConsumerRunningError",
        "ConsumerStats",
        "CorruptTaskError",
        "DeadLetter",
        "Handler",
        "InvalidGroupError",
        "InvalidResultError",
        "InvalidTaskError",
        "NoResultError",
        "NotOpenError",
        "NotReplicatedError",
        "OutcomeUnknownError",
        "PayloadTooLargeError",
        "PermissionDeniedError",
        "Problem",
        "Producer",
        "QueueFullError",
        "RedisUnavailableError",
        "Repair",
        "Retry",
        "Schedule",
        "Task",
        "TaskCancelledError",
        "TaskFailedError",
        "TaskInfo",
        "TaskNotFoundError",
        "TaskState",
        "UnencodablePayloadError",
        "UnknownTaskTypeError",
        "check_queue",
        "current_task",
        "current_batch",
        "BatchFailed",
        "EventKind",
        "MissingExtraError",
        "Observer",
        "TaskEvent",
        "repair_queue",
    }
)

PUBLIC_CLASSES = sorted(
    name for name in PUBLIC_NAMES if inspect.isclass(getattr(aiogroupq, name, None))
)


def test_all_is_exactly_the_sorted_public_names() -> None:
    assert set(aiogroupq.__all__) == PUBLIC_NAMES
    # Sorted and without duplicates, so diffs of __all__ stay readable.
    assert list(aiogroupq.__all__) == sorted(PUBLIC_NAMES)


@pytest.mark.parametrize("name", sorted(PUBLIC_NAMES))
def test_each_public_name_exists(name: str) -> None:
    assert hasattr(aiogroupq, name)


def test_no_public_class_or_function_is_left_out_of_all() -> None:
    # A class or function reachable as aiogroupq.X but missing from __all__ is
    # half-public: star imports and docs miss it while users depend on it.
    stray = [
        name
        for name, obj in vars(aiogroupq).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", "").startswith("aiogroupq")
        and name not in PUBLIC_NAMES
    ]
    assert stray == []


@pytest.mark.parametrize(
    "name", [*PUBLIC_CLASSES, "check_queue", "current_task", "repair_queue"]
)
def test_public_objects_report_the_public_module(name: str) -> None:
    # Tracebacks, reprs and pickles should show aiogroupq.X, not a private path.
    assert getattr(aiogroupq, name).__module__ == "aiogroupq"


def _methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_producer_and_admin_share_no_method() -> None:
    # Reading and writing tasks is the producer's; operating the queue
    # (settings, dead letters, views) is the admin's. A method on both would
    # leave users two ways to do one thing.
    assert _methods(aiogroupq.Producer) & _methods(aiogroupq.Admin) == set()
    assert {"dead_letters", "requeue_dead", "purge_dead", "release_group"} <= (
        _methods(aiogroupq.Admin)
    )
    assert {"status", "status_many"} <= _methods(aiogroupq.Producer)


def test_version_is_a_string() -> None:
    assert isinstance(aiogroupq.__version__, str)
    assert aiogroupq.__version__


def test_py_typed_ships_inside_the_package() -> None:
    # PEP 561: without the marker, type checkers ignore our annotations.
    assert files("aiogroupq").joinpath("py.typed").is_file()


@pytest.mark.parametrize(
    "name",
    [
        "lib/base",
        "lib/groups",
        "lib/inspect",
        "enqueue",
        "claim",
        "finish",
        "control",
        "stats",
        "group_info",
        "consumers",
        "task_info",
        "statuses",
    ],
)
def test_lua_scripts_ship_inside_the_package(name: str) -> None:
    script = files("aiogroupq").joinpath("_lua", f"{name}.lua")
    assert script.is_file()
    # An empty file would load fine and then fail on the first EVALSHA.
    assert script.read_text(encoding="utf-8").strip()


def test_task_state_values_are_pinned() -> None:
    assert issubclass(aiogroupq.TaskState, str)
    assert issubclass(aiogroupq.TaskState, enum.Enum)
    assert {state.name: state.value for state in aiogroupq.TaskState} == {
        "QUEUED": "queued",
        "DELAYED": "delayed",
        "RUNNING": "running",
        "SUCCEEDED": "succeeded",
        "DEAD": "dead",
        "CANCELLED": "cancelled",
        "EXPIRED": "expired",
    }


def test_task_state_behaves_as_its_string() -> None:
    state = aiogroupq.TaskState.SUCCEEDED
    # Comparable with, and formatted as, the plain value (JSON, logs, f-strings).
    assert state == "succeeded"
    assert str(state) == "succeeded"
    assert f"{state}" == "succeeded"
    assert aiogroupq.TaskState("dead") is aiogroupq.TaskState.DEAD


def test_error_hierarchy() -> None:
    base = aiogroupq.AiogroupqError
    for cls in (
        aiogroupq.ConfigurationError,
        aiogroupq.InvalidTaskError,
        aiogroupq.TaskNotFoundError,
        aiogroupq.TaskFailedError,
        aiogroupq.TaskCancelledError,
        aiogroupq.NoResultError,
        aiogroupq.InvalidResultError,
        aiogroupq.CorruptTaskError,
        aiogroupq.QueueFullError,
        aiogroupq.RedisUnavailableError,
        aiogroupq.ConsumerRunningError,
    ):
        assert issubclass(cls, base)
    # Refused credentials and ACL denials are configuration, not outages.
    for config_error in (
        aiogroupq.AuthenticationError,
        aiogroupq.PermissionDeniedError,
    ):
        assert issubclass(config_error, aiogroupq.ConfigurationError)
    assert issubclass(aiogroupq.ConsumerRunningError, RuntimeError)
    # Bad arguments are ValueErrors, so generic validation handlers catch them.
    for value_error in (
        aiogroupq.ConfigurationError,
        aiogroupq.InvalidTaskError,
        aiogroupq.InvalidGroupError,
        aiogroupq.PayloadTooLargeError,
        aiogroupq.UnencodablePayloadError,
        aiogroupq.UnknownTaskTypeError,
    ):
        assert issubclass(value_error, ValueError)
    for task_error in (
        aiogroupq.InvalidGroupError,
        aiogroupq.PayloadTooLargeError,
        aiogroupq.UnencodablePayloadError,
        aiogroupq.UnknownTaskTypeError,
    ):
        assert issubclass(task_error, aiogroupq.InvalidTaskError)
    assert issubclass(aiogroupq.TaskNotFoundError, LookupError)
    # Callers that already handle connection trouble generically catch it.
    assert issubclass(aiogroupq.RedisUnavailableError, ConnectionError)
    # An unknown outcome is still an outage to `except RedisUnavailableError`.
    assert issubclass(aiogroupq.OutcomeUnknownError, aiogroupq.RedisUnavailableError)
    assert issubclass(aiogroupq.BatchTooLargeError, aiogroupq.InvalidTaskError)
    # Code that caught the plain RuntimeError of a closed handle still does.
    assert issubclass(aiogroupq.NotOpenError, RuntimeError)
    # Retry is control flow, not an error: `except AiogroupqError` must not eat it.
    assert not issubclass(aiogroupq.Retry, base)


def test_retry_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="-1"):
        aiogroupq.Retry(delay=-1)
    assert aiogroupq.Retry().delay is None


@pytest.mark.parametrize("delay", [math.inf, math.nan, 365 * 86400 + 1, 1e12])
def test_retry_refuses_an_endless_delay(delay: float) -> None:
    # A grouped task holds its group until its retry runs: Retry(inf) held
    # it for good (and then failed the consumer's conversion to server ms).
    with pytest.raises(ValueError, match="365 days"):
        aiogroupq.Retry(delay=delay)
    assert aiogroupq.Retry(delay=365 * 86400).delay == 365 * 86400


def test_outcome_unknown_error_names_the_ids() -> None:
    ids = [f"{i:028x}" for i in range(7)]
    error = aiogroupq.OutcomeUnknownError(ids, "127.0.0.1:1: no reply within 5.0 s")
    assert error.task_ids == ids
    assert error.detail == "127.0.0.1:1: no reply within 5.0 s"
    text = str(error)
    assert text.startswith("outcome unknown: 7 tasks")
    assert ids[0] in text
    assert "status_many" in text
