"""``aiogroupq demo``: a mixed workload, consumed by worker processes, verified.

The parent enqueues the plan (a few hot groups holding a large share, many
small groups, ungrouped tasks) and runs ``aiogroupq worker
aiogroupq._cli.demo:worker --processes N``. Every handler journals its start and
end in one Lua call that takes a number from a global logical clock (``INCR``)
and the server's ``TIME``. The parent reads the journal after the workers have
stopped and checks, without trusting the library's own bookkeeping: each task
started once and ended once, a group's tasks started in enqueue order, and no
task of a group started while another one of it was running. It also checks
that every task's state is ``succeeded`` (read in pipelines, with progress).

It says what it does before each step (starting the server, starting the
worker processes, enqueueing), then shows progress: while no task has started
yet, that the workers are still starting; at the end, once every task left
belongs to a few groups (the hot ones), that these run one task at a time by
design, which is why the rate drops. Progress is redrawn in place on a
terminal and printed as plain lines once a second otherwise. SIGINT (Ctrl-C), SIGTERM and SIGHUP (a closed terminal)
stop the run within about a second: the workers are stopped (killed if
they linger), the throwaway server is stopped and the temporary files are
removed; the exit status is 128 + the signal number.

Its parts: the workload and its enqueueing (``demo_plan``), the progress
lines (``demo_progress``), the journal and its verification
(``demo_journal``), the terminal and the stop signals (``demo_console``).
Here: the worker factory and the run, with the demo's own Redis commands
(the journal, the states, the clean-up), which a queue's ACL rule need not
grant (``tests/test_acl.py`` counts this module as an operator's).
"""

from __future__ import annotations

__all__ = ("run_demo", "worker")

import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import anyio
import redis.asyncio
from anyio.abc import Process
from redis.exceptions import RedisError

import aiogroupq

from .._store.keys import QueueKeys
from ..testing._server import ServerProcess, ServerStartError
from .demo_console import Console, Interrupted, StopSignals
from .demo_journal import JOURNAL_LUA, conclude, journal_keys
from .demo_plan import BATCH, Job, enqueue_plan, make_plan
from .demo_progress import Remaining, progress_line, tail_line

#: give up when no task completes for this long (a lost task would hang us)
STALL_TIMEOUT: Final = 60.0


@asynccontextmanager
async def worker(
    *, redis_url: str, queue: str | None, concurrency: int
) -> AsyncIterator[aiogroupq.Consumer]:
    """The demo's Consumer factory for ``aiogroupq worker``.

    :param redis_url: the server
    :param queue: the demo queue (required)
    :param concurrency: handlers at once
    """
    if queue is None:
        raise aiogroupq.ConfigurationError("the demo worker needs --queue")
    keys = journal_keys(queue)
    client = redis.asyncio.Redis.from_url(redis_url)
    journal = client.register_script(JOURNAL_LUA)

    async def record(event: str, job: Job) -> None:
        attempt = aiogroupq.current_task().attempt
        entry = f"{event} {job.i} {job.seq} {attempt} {job.group or '-'}"
        await journal(keys=keys, args=[entry, event])

    # The consumer reads the payload's type from this annotation at run time
    # (typing.get_type_hints): Job must be a run-time import of this module.
    async def handle(job: Job) -> None:
        await record("s", job)
        # Mostly instant, a few take up to 2 ms: like real I/O-bound jobs.
        await anyio.sleep(job.work_us / 1_000_000)
        await record("e", job)

    handlers = {"import_rows": handle, "send_mail": handle, "resize_image": handle}
    try:
        yield aiogroupq.Consumer(
            redis_url,
            queue=queue,
            handlers=handlers,
            concurrency=concurrency,
            grace_period=10.0,
        )
    finally:
        await client.aclose()


# -- the run ---------------------------------------------------------------------


#: how long workers get to stop after an interrupt before they are killed
_INTERRUPT_PATIENCE: Final = 0.5
#: task states read per pipeline by the verification
_STATE_CHUNK: Final = 2_000


def run_demo(
    *,
    redis_url: str | None,
    tasks: int,
    groups: int,
    processes: int,
    concurrency: int,
    seed: int | None = None,
) -> int:
    """Run the demo; return 0 if verification passed, 1 if not, 2 on setup
    errors, 128 + the signal number when stopped by SIGINT, SIGTERM or SIGHUP.

    On a stop signal the workers get half a second to stop, then are told to
    cancel their handlers, then killed; the throwaway server is stopped and
    the temporary files are removed.

    :param redis_url: the server to use; ``None`` starts a throwaway one
    :param tasks: how many tasks to enqueue
    :param groups: over how many groups
    :param processes: worker processes
    :param concurrency: handlers at once per process
    :param seed: the workload's random seed (default: random)
    """
    seed = random.randrange(2**32) if seed is None else seed
    jobs, description = make_plan(tasks, groups, random.Random(seed))
    console = Console()
    queue = f"demo-{secrets.token_hex(4)}"
    console.say(f"workload: {description} (seed {seed})")
    console.say(
        f"workers:  {processes} processes x {concurrency} concurrency, queue {queue}"
    )
    with StopSignals(console) as stop:
        try:
            with ExitStack() as stack:
                throwaway = redis_url is None
                if redis_url is None:
                    console.say(
                        "server:   starting a throwaway server "
                        "(give --redis-url to use yours)"
                    )
                    try:
                        with stop.raising():
                            server = stack.enter_context(
                                ServerProcess(
                                    # Killed with the demo if it is killed
                                    # (kill -9): only where this thread is
                                    # the main one, which ends with us.
                                    die_with_parent=threading.current_thread()
                                    is threading.main_thread()
                                )
                            )
                    except ServerStartError as exc:
                        console.say(f"aiogroupq demo: error: {exc}", err=True)
                        return 2
                    redis_url = server.url
                    console.say(f"server:   {server.binary} (throwaway) at {redis_url}")
                tmp = stack.enter_context(
                    tempfile.TemporaryDirectory(prefix="aiogroupq-demo-")
                )
                log_path = Path(tmp) / "workers.log"
                with open(log_path, "wb") as log:
                    run = _Run(redis_url, queue, jobs, log, console, stop, throwaway)
                    code = anyio.run(run.main, processes, concurrency)
                if code == 1:
                    console.say("worker log (last lines):", err=True)
                    lines = log_path.read_text(errors="replace").splitlines()[-20:]
                    console.say("\n".join(lines), err=True)
                if stop.signum is None:
                    return code
        except Interrupted:
            stop.announce()
        assert stop.signum is not None
        console.say(f"aiogroupq demo: stopped by {stop.signum.name}", err=True)
        return 128 + stop.signum


@dataclass
class _Run:
    """One demo run inside the event loop."""

    url: str
    queue: str
    jobs: list[Job]
    log: IO[bytes]
    console: Console
    stop: StopSignals
    throwaway: bool

    async def main(self, processes: int, concurrency: int) -> int:
        with anyio.CancelScope() as scope, self.stop.cancels(scope):
            return await self._drive(processes, concurrency)
        return 128 + (self.stop.signum or signal.SIGINT)

    async def _drive(self, processes: int, concurrency: int) -> int:
        say = self.console.say
        keys = journal_keys(self.queue)
        try:
            client = redis.asyncio.Redis.from_url(self.url)
        except ValueError as exc:
            say(f"aiogroupq demo: error: {exc}", err=True)
            return 2
        async with client:
            try:
                await client.ping()
            except (RedisError, OSError) as exc:
                say(f"aiogroupq demo: error: cannot reach the server: {exc}", err=True)
                return 2
            say(
                f"workers:  starting {processes} worker processes: aiogroupq "
                f"worker {__name__}:worker --queue {self.queue} "
                f"--processes {processes}"
            )
            process = await self._start_workers(processes, concurrency)
            try:
                say(
                    f"enqueue:  {len(self.jobs):,} tasks in batches of {BATCH:,}, "
                    "while the workers start"
                )
                started = anyio.current_time()
                ids = await enqueue_plan(client, self.queue, self.jobs, started, say)
                finished = await self._follow(client, keys, len(ids), process)
                elapsed = anyio.current_time() - started
                self.console.progress("stopping the workers", final=True)
                await _stop(process, patience=60.0)
                journal = await client.lrange(keys[1], 0, -1)
                self.console.progress(
                    f"verifying: {len(journal):,} journal records read", final=True
                )
                states = await self._states(client, ids)
            finally:
                with anyio.CancelScope(shield=True):
                    interrupted = self.stop.signum is not None
                    await _stop(
                        process, patience=_INTERRUPT_PATIENCE if interrupted else 60.0
                    )
                    if not self.throwaway:  # a throwaway server goes as a whole
                        with anyio.move_on_after(10):
                            await self._clean_up(client)
        checks = (
            (finished, "the workers exited or stalled before the end"),
            (process.returncode == 0, f"workers' exit status {process.returncode}"),
        )
        return conclude(self.jobs, journal, states, elapsed, checks, say)

    async def _start_workers(self, processes: int, concurrency: int) -> Process:
        """``aiogroupq worker`` on the demo's queue, its output in the log."""
        argv = [sys.executable, "-m", "aiogroupq", "worker", f"{__name__}:worker"]
        argv += ["--queue", self.queue, "--redis-url", self.url]
        argv += ["--processes", str(processes), "--concurrency", str(concurrency)]
        argv += ["--parent-pid", str(os.getpid())]
        # A session of its own: a Ctrl-C reaches only us; we stop the workers.
        return await anyio.open_process(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,
        )

    async def _follow(
        self,
        client: redis.asyncio.Redis,
        keys: tuple[str, str, str],
        total: int,
        process: Process,
    ) -> bool:
        """Show progress until every task ended; False on a stall. The
        journal's new records tell whether a task has started yet and what
        is left (read with the done counter, in one round trip)."""
        _clock, journal_key, done_key = keys
        remaining = Remaining(self.jobs)
        read = 0  # journal records taken so far
        told_tail = False
        window: deque[tuple[float, int]] = deque()
        last_change, last_done = anyio.current_time(), -1
        while True:
            async with client.pipeline(transaction=False) as pipe:
                pipe.get(done_key)
                pipe.lrange(journal_key, read, -1)
                counter, records = await pipe.execute()
            done = int(counter or 0)
            read += len(records)
            remaining.feed(records)
            tail = remaining.tail()
            if tail and not told_tail:
                told_tail = True
                self.console.say(tail_line(remaining.left, tail))
            now = anyio.current_time()
            window.append((now, done))
            while now - window[0][0] > 1.0:
                window.popleft()
            span = now - window[0][0]
            rate = (done - window[0][1]) / span if span > 0 else 0.0
            end = done >= total
            stalled = (
                process.returncode is not None or now - last_change > STALL_TIMEOUT
            )
            self.console.progress(
                progress_line(done, total, rate, started=remaining.started, tail=tail),
                final=end or stalled,
            )
            if end:
                return True
            if done != last_done:
                last_change, last_done = now, done
            if stalled:
                return False
            await anyio.sleep(0.1)

    async def _states(
        self, client: redis.asyncio.Redis, ids: Sequence[str]
    ) -> Counter[str]:
        """Every task's state, read in pipelines of :data:`_STATE_CHUNK`.

        (Reads the task hashes' state field as ``Producer.status`` does; a
        batched status call of the library would replace this.)
        """
        keys = QueueKeys(self.queue)
        states: Counter[str] = Counter()
        for at in range(0, len(ids), _STATE_CHUNK):
            part = ids[at : at + _STATE_CHUNK]
            async with client.pipeline(transaction=False) as pipe:
                for task_id in part:
                    pipe.hget(keys.task(task_id), "s")
                for state in await pipe.execute():
                    states["unknown" if state is None else state.decode()] += 1
            self.console.progress(
                f"verifying: {at + len(part):,}/{len(ids):,} task states read",
                final=at + len(part) == len(ids),
            )
        return states

    async def _clean_up(self, client: redis.asyncio.Redis) -> None:
        """Delete the demo's keys from a server that is not ours to drop."""
        await client.delete(*journal_keys(self.queue))
        deleted = 0
        batch: list[bytes] = []
        async for key in client.scan_iter(
            match=QueueKeys(self.queue).pattern(), count=1000
        ):
            batch.append(key)
            if len(batch) == 1000:
                deleted += await client.unlink(*batch)
                batch.clear()
                self.console.progress(f"cleaning up: {deleted:,} keys deleted")
        if batch:
            deleted += await client.unlink(*batch)
        self.console.progress(f"cleaning up: {deleted:,} keys deleted", final=True)


async def _stop(process: Process, *, patience: float) -> None:
    """Stop the workers: SIGTERM (the supervisor forwards it and each worker
    finishes its running handlers), again after *patience* (they cancel
    them), then SIGKILL."""
    for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
        if process.returncode is not None:
            return
        with suppress(ProcessLookupError):
            process.send_signal(signum)
        with anyio.move_on_after(patience):
            await process.wait()
            return
        patience = 1.0
    await process.wait()
