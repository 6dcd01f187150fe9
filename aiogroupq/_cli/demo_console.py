"""The demo's terminal: progress output that suits a terminal or a pipe, and
the stop signals (Ctrl-C, ``kill``, a closed terminal)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, Final, Self

import anyio


class Interrupted(Exception):
    """A stop signal arrived outside the event loop."""


class Console:
    """The demo's output: progress on stderr (rewritten in place on a
    terminal, plain periodic lines otherwise), results on stdout. Writes to a
    closed terminal (SIGHUP) are dropped: cleaning up matters more."""

    def __init__(self) -> None:
        self.tty = _isatty(sys.stderr)
        self._open_line = False
        self._last = -float("inf")

    def say(self, text: str, *, err: bool = False) -> None:
        stream = sys.stderr if err else sys.stdout
        try:
            if self._open_line:
                sys.stderr.write("\n")
                self._open_line = False
            stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):
            pass

    def progress(self, text: str, *, final: bool = False) -> None:
        """Show a progress line: at most every 0.2 s on a terminal, every
        second otherwise, and always when *final*."""
        now = time.monotonic()
        if not final and now - self._last < (_TTY_EVERY if self.tty else _PLAIN_EVERY):
            return
        self._last = now
        try:
            if self.tty:
                sys.stderr.write(f"\r{text}   ")
                self._open_line = not final
                if final:
                    sys.stderr.write("\n")
            else:
                sys.stderr.write(text + "\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


#: progress refresh on a terminal, and line interval otherwise (seconds)
_TTY_EVERY: Final = 0.2
_PLAIN_EVERY: Final = 1.0
#: signals that stop the demo: Ctrl-C, kill, and the terminal closing
_STOP_SIGNALS: Final = tuple(
    getattr(signal, name)
    for name in ("SIGINT", "SIGTERM", "SIGHUP")
    if hasattr(signal, name)
)  # (no SIGHUP on Windows)


class StopSignals:
    """The demo's handler of SIGINT, SIGTERM and SIGHUP for its whole run.

    One handler throughout, so that no signal kills the demo before it has
    stopped its workers and its server. The first signal is recorded; inside
    the event loop it cancels the run (from the loop, not from the handler);
    while the server starts it raises :class:`Interrupted`. Later signals
    are ignored: cleaning up is under way.
    """

    def __init__(self, console: Console) -> None:
        self.console = console
        self.signum: signal.Signals | None = None
        self._raise = False
        self._cancel: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for signum in _STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def announce(self) -> None:
        assert self.signum is not None
        self.console.say(
            f"aiogroupq demo: {self.signum.name}: stopping the workers and the server",
            err=True,
        )

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            return
        self.signum = signal.Signals(signum)
        if self._cancel is not None:
            self._cancel()
        elif self._raise:
            raise Interrupted

    @contextmanager
    def raising(self) -> Iterator[None]:
        """While in this block, a signal raises :class:`Interrupted`."""
        self._raise = True
        try:
            if self.signum is not None:
                raise Interrupted
            yield
        finally:
            self._raise = False

    @contextmanager
    def cancels(self, scope: anyio.CancelScope) -> Iterator[None]:
        """While in this block, a signal cancels *scope*."""
        loop = asyncio.get_running_loop()

        def cancel() -> None:
            self.announce()
            scope.cancel()

        # Signal handlers run between two bytecodes of the main thread: hand
        # the work to the event loop (printing there cannot re-enter a write).
        def schedule() -> None:
            loop.call_soon_threadsafe(cancel)

        self._cancel = schedule
        try:
            if self.signum is not None:
                cancel()
            yield
        finally:
            self._cancel = None
