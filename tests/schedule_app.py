"""An application with a periodic task, run by the scheduling tests as
``aiogroupq worker tests.schedule_app:handlers --queue Q`` processes.

The worker picks up :data:`schedules` beside the handlers mapping. Each run
appends ``"<tick ms> <task id> <pid> <server ms at start>"`` to :data:`RUNS_KEY`
on the server named by ``$SCHEDULE_APP_REDIS_URL``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Final

import redis.asyncio

import aiogroupq

#: seconds between ticks of the ``beat`` schedule
EVERY: Final = 0.2
#: where each run is journaled (outside every queue's keys)
RUNS_KEY: Final = "schedule-app:runs"


async def beat() -> None:
    """Journal this run: its tick, its id, this process, when it started."""
    info = aiogroupq.current_task()
    async with redis.asyncio.Redis.from_url(
        os.environ["SCHEDULE_APP_REDIS_URL"]
    ) as client:
        seconds, micros = await client.time()
        line = (
            f"{round(info.enqueued_at * 1000)} {info.id} {os.getpid()} "
            f"{seconds * 1000 + micros // 1000}"
        )
        await client.rpush(RUNS_KEY, line)


#: the mapping form
handlers = {"beat": beat}

#: picked up by the worker because it sits beside ``handlers``
schedules = [aiogroupq.Schedule("beat", "beat", every=EVERY)]

#: ``tests.schedule_app:broken.handlers``: a ``schedules`` beside it that is not
#: a list of Schedule
broken = SimpleNamespace(handlers=handlers, schedules="beat every 0.2 s")
