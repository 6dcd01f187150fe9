"""aiogroupq: an asyncio task queue on Redis with group-serial execution.

Tasks sharing a group key run one at a time, in enqueue order, across every
coroutine, process and machine; everything else runs in parallel.
"""

from __future__ import annotations

import logging

from ._check.check import check_queue as check_queue
from ._check.problems import Problem as Problem
from ._check.repair import Repair as Repair, repair_queue as repair_queue
from ._inspect.estimate import StartEstimate as StartEstimate
from ._inspect.views import (
    ConsumerInfo as ConsumerInfo,
    ConsumerStats as ConsumerStats,
    GroupInfo as GroupInfo,
    GroupPage as GroupPage,
    GroupState as GroupState,
    GroupTask as GroupTask,
    QueueStats as QueueStats,
    TaskDetails as TaskDetails,
)
from ._store.settings import (
    GroupSettings as GroupSettings,
    QueueSettings as QueueSettings,
    Rate as Rate,
)
from ._telemetry.events import (
    EventKind as EventKind,
    Observer as Observer,
    TaskEvent as TaskEvent,
)
from ._work.handlers import Handler as Handler
from ._work.schedule import Schedule as Schedule
from .admin import Admin as Admin
from .consumer import Consumer as Consumer
from .errors import (
    AiogroupqError as AiogroupqError,
    AuthenticationError as AuthenticationError,
    BatchFailed as BatchFailed,
    BatchTooLargeError as BatchTooLargeError,
    ConfigurationError as ConfigurationError,
    ConsumerRunningError as ConsumerRunningError,
    CorruptQueueError as CorruptQueueError,
    CorruptTaskError as CorruptTaskError,
    GroupFullError as GroupFullError,
    InvalidGroupError as InvalidGroupError,
    InvalidResultError as InvalidResultError,
    InvalidTaskError as InvalidTaskError,
    MissingExtraError as MissingExtraError,
    NoResultError as NoResultError,
    NotOpenError as NotOpenError,
    NotReplicatedError as NotReplicatedError,
    OutcomeUnknownError as OutcomeUnknownError,
    PayloadTooLargeError as PayloadTooLargeError,
    PermissionDeniedError as PermissionDeniedError,
    QueueFullError as QueueFullError,
    RedisUnavailableError as RedisUnavailableError,
    Retry as Retry,
    TaskCancelledError as TaskCancelledError,
    TaskExpiredError as TaskExpiredError,
    TaskFailedError as TaskFailedError,
    TaskNotFoundError as TaskNotFoundError,
    UnencodablePayloadError as UnencodablePayloadError,
    UnknownTaskTypeError as UnknownTaskTypeError,
)
from .producer import Producer as Producer
from .task import (
    DeadLetter as DeadLetter,
    Task as Task,
    TaskInfo as TaskInfo,
    TaskState as TaskState,
    current_batch as current_batch,
    current_task as current_task,
)

__version__ = "0.1.0"

__all__ = (
    "Admin",
    "AiogroupqError",
    "AuthenticationError",
    "BatchFailed",
    "BatchTooLargeError",
    "ConfigurationError",
    "Consumer",
    "ConsumerInfo",
    "ConsumerRunningError",
    "ConsumerStats",
    "CorruptQueueError",
    "CorruptTaskError",
    "DeadLetter",
    "EventKind",
    "GroupFullError",
    "GroupInfo",
    "GroupPage",
    "GroupSettings",
    "GroupState",
    "GroupTask",
    "Handler",
    "InvalidGroupError",
    "InvalidResultError",
    "InvalidTaskError",
    "MissingExtraError",
    "NoResultError",
    "NotOpenError",
    "NotReplicatedError",
    "Observer",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Problem",
    "Producer",
    "QueueFullError",
    "QueueSettings",
    "QueueStats",
    "Rate",
    "RedisUnavailableError",
    "Repair",
    "Retry",
    "Schedule",
    "StartEstimate",
    "Task",
    "TaskCancelledError",
    "TaskDetails",
    "TaskEvent",
    "TaskExpiredError",
    "TaskFailedError",
    "TaskInfo",
    "TaskNotFoundError",
    "TaskState",
    "UnencodablePayloadError",
    "UnknownTaskTypeError",
    "check_queue",
    "current_batch",
    "current_task",
    "repair_queue",
)

# Tracebacks and docs show the public path, not the private module.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("aiogroupq."):
        _obj.__module__ = __name__
del _name, _obj

logging.getLogger(__name__).addHandler(logging.NullHandler())
