"""Helpers for testing code that uses aiogroupq.

- :func:`run_inline` runs one handler in the current event loop, as a
  consumer would (payload decoding, :func:`aiogroupq.current_task`), without
  Redis.
- :func:`drain` consumes a queue in this process until it is idle and returns
  what became of each task (:class:`TaskOutcome`).
- :class:`Journal` records handler runs; :func:`assert_group_order` checks
  that each group's tasks started in enqueue order and never overlapped.
- :class:`ServerProcess` is a throwaway Redis-protocol server on a free port;
  the pytest plugin ``aiogroupq.testing.pytest_plugin`` wraps it in fixtures
  (opt in with ``pytest_plugins = ["aiogroupq.testing.pytest_plugin"]`` in
  your top ``conftest.py``).

See docs/testing.md.
"""

from __future__ import annotations

from ._drain import drain as drain
from ._errors import (
    DrainTimeoutError as DrainTimeoutError,
    GroupOrderError as GroupOrderError,
    PayloadDecodeError as PayloadDecodeError,
    ResultEncodeError as ResultEncodeError,
)
from ._inline import run_inline as run_inline
from ._journal import (
    Journal as Journal,
    JournalEntry as JournalEntry,
    assert_group_order as assert_group_order,
)
from ._outcome import TaskOutcome as TaskOutcome
from ._server import (
    ServerProcess as ServerProcess,
    ServerStartError as ServerStartError,
    find_server_binary as find_server_binary,
)

__all__ = (
    "DrainTimeoutError",
    "GroupOrderError",
    "Journal",
    "JournalEntry",
    "PayloadDecodeError",
    "ResultEncodeError",
    "ServerProcess",
    "ServerStartError",
    "TaskOutcome",
    "assert_group_order",
    "drain",
    "find_server_binary",
    "run_inline",
)

# Tracebacks and docs show the public path, not the private module.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith(
        ("aiogroupq.testing.", "aiogroupq._")
    ):
        _obj.__module__ = __name__
del _name, _obj
