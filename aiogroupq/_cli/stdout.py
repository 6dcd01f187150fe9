"""The command line's standard output, and what it does when the reader
goes away (``aiogroupq dead list | head``).

A closed pipe is the reader's choice, not a failure: Unix tools die of
SIGPIPE without a word, and the shell reports 141. Python ignores SIGPIPE
and raises :class:`BrokenPipeError` instead, which is a builtin
``ConnectionError``: inside a command it would pass for a Redis connection
failure ("Redis is unreachable ... Broken pipe"). So the commands write
through :func:`say`, which raises :class:`StdoutClosed` (no ``OSError``), and
:func:`main <aiogroupq._cli.main.main>` ends quietly with
:func:`closed_stdout`.

What it prints is shown through :func:`~aiogroupq._inspect.printable.printable`
(line breaks kept): stored text (a group name, an error, a traceback) is
whatever anything with access to Redis wrote, and a terminal would act on
the escape sequences in it. :func:`complain` does the same on the standard
error.
"""

from __future__ import annotations

__all__ = ("CLOSED_STATUS", "StdoutClosed", "closed_stdout", "complain", "say")

import os
import signal
import sys
from typing import Final

from .._inspect.printable import printable

#: the exit status of a command whose reader went away: what a shell
#: reports for a Unix tool killed by SIGPIPE
CLOSED_STATUS: Final = 128 + signal.SIGPIPE


class StdoutClosed(Exception):
    """Whoever read the standard output stopped reading."""


def say(
    *values: object, end: str = "\n", flush: bool = False, raw: bool = False
) -> None:
    """``print`` to the standard output, control characters but line breaks
    shown escaped.

    :param raw: print as it is: only for the command line's own escape
        sequences (clearing the terminal), never for stored text
    :raises StdoutClosed: if the reader has gone away
    """
    text = " ".join(map(str, values))
    try:
        print(text if raw else printable(text, keep="\n"), end=end, flush=flush)
    except BrokenPipeError:
        raise StdoutClosed from None


def complain(line: str) -> None:
    """Print *line*, an error message, to the standard error, control
    characters but line breaks shown escaped."""
    print(printable(line, keep="\n"), file=sys.stderr)


def closed_stdout() -> int:
    """Stop writing to the gone reader; return :data:`CLOSED_STATUS`.

    What is left in the buffer goes to ``/dev/null`` (the recipe of the
    Python documentation's ``signal`` page): the interpreter flushes the
    standard output at exit, and would print an "Exception ignored"
    traceback for the same broken pipe.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return CLOSED_STATUS
