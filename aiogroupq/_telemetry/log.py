"""How aiogroupq describes tasks in its logs, and the command line's log setup.

Task events carry ``queue``, ``task_id``, ``task_type``, ``group`` and
``attempt`` as extra fields of the record and the same facts in the message,
so plain text and JSON lines say the same. Payloads are never logged.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, Literal

#: the line format of ``aiogroupq worker`` without ``--log-format json``
TEXT_FORMAT: Final = "%(asctime)s %(levelname)-7s [%(process)d] %(name)s: %(message)s"

LogFormat = Literal["text", "json"]


def short(text: str, limit: int = 200) -> str:
    """``repr(text)``, cut to about *limit* characters."""
    shown = repr(text)
    return shown if len(shown) <= limit else f"{shown[:limit]}… ({len(text)} chars)"


def describe(
    task_id: str,
    task_type: str | None,
    group: str | None,
    attempt: int | None,
    max_attempts: int | None = None,
) -> str:
    """``task <id> (type 'x', group 'g', attempt 1 of 3)``, with what is known."""
    facts = []
    if task_type is not None:
        facts.append(f"type {short(task_type)}")
    if group is not None:
        facts.append(f"group {short(group)}")
    if attempt is not None:
        facts.append(
            f"attempt {attempt}"
            if max_attempts is None
            else f"attempt {attempt} of {max_attempts}"
        )
    return f"task {task_id} ({', '.join(facts)})" if facts else f"task {task_id}"


def task_extra(
    queue: str,
    task_id: str,
    task_type: str | None,
    group: str | None,
    attempt: int | None,
) -> dict[str, object]:
    """The extra fields of a record about one task."""
    return {
        "queue": queue,
        "task_id": task_id,
        "task_type": task_type,
        "group": group,
        "attempt": attempt,
    }


# What every record has: anything else on a record came from ``extra``.
_STANDARD: Final = frozenset(
    (*vars(logging.makeLogRecord({})), "message", "asctime", "taskName")
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``,
    ``logger``, ``message``, ``process``, the record's extra fields, and
    ``exception`` (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            key: value
            for key, value in vars(record).items()
            if key not in _STANDARD and not key.startswith("_")
        }
        entry.update(
            time=datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            level=record.levelname,
            logger=record.name,
            message=record.getMessage(),
            process=record.process,
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=repr, ensure_ascii=False)


class _Escaped(logging.Formatter):
    """A formatter whose lines pass through *escape*: a record quotes what
    handlers and Redis hold (an error's text, a name), which may carry bytes
    a terminal acts on."""

    def __init__(self, inner: logging.Formatter, escape: Callable[[str], str]):
        super().__init__()
        self._inner = inner
        self._escape = escape

    def format(self, record: logging.LogRecord) -> str:
        return self._escape(self._inner.format(record))


def configure(
    *,
    verbose: bool,
    log_format: LogFormat,
    escape: Callable[[str], str] | None = None,
) -> None:
    """Log to stderr at INFO; *verbose* lowers only aiogroupq's own loggers
    to DEBUG (asyncio's and redis-py's stay at INFO); each formatted record
    passes through *escape* when given."""
    handler = logging.StreamHandler(sys.stderr)
    inner: logging.Formatter
    if log_format == "json":
        inner = JsonFormatter()
        logging.captureWarnings(True)  # every line stays JSON
    else:
        inner = logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(inner if escape is None else _Escaped(inner, escape))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    if verbose:
        logging.getLogger("aiogroupq").setLevel(logging.DEBUG)
