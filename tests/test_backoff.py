"""Retry backoff as the server records it: growth, cap, jitter, and the
per-type override, read from the due times ``finish.lua`` computes.

No delay is waited out and no elapsed time is measured. After each failed
attempt the test reads the retry's due time (its score in the ``delayed``
set, on the server's clock) and brackets the delay the consumer asked for:
``finish.lua`` took "now" after the handler failed (the handler read the
server clock just before raising) and before the test read the clock, so

    due - read_at - 1 ms  <=  delay  <=  due - failed_at

Then the test makes the retry due at once and wakes the consumer. The bases
are minutes long, so the bracket (milliseconds wide) pins each delay down to
a few parts in 100,000.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import anyio
import redis.asyncio

import aiogroupq
from aiogroupq._store.keys import QueueKeys

QUEUE = "backoff"
KEYS = QueueKeys(QUEUE)
#: the consumer's policy, used by task type "plain"
BASE, CAP = 7.0, 20.0
#: task type "tuned" overrides both with aiogroupq.Handler(...)
TUNED_BASE, TUNED_CAP = 100.0, 350.0
#: attempts per task: 4 failures are retried (attempt 4 reaches both caps)
ATTEMPTS = 5
TASKS_PER_TYPE = 4


class Boom(Exception):
    pass


@dataclass(frozen=True)
class Sample:
    task_type: str
    attempt: int  # the failed attempt whose retry this is
    low_ms: float  # the delay is at least this…
    high_ms: float  # …and at most this

    def expected_ms(self) -> float:
        """The delay before jitter: base * 2**(attempt-1), capped."""
        base, cap = (
            (TUNED_BASE, TUNED_CAP) if self.task_type == "tuned" else (BASE, CAP)
        )
        growth: float = 2.0 ** (self.attempt - 1)
        return min(cap, base * growth) * 1000


async def server_ms(client: redis.asyncio.Redis) -> float:
    seconds, micros = await client.time()
    return float(int(seconds) * 1000 + int(micros) / 1000)


async def sample_retries(
    client: redis.asyncio.Redis,
    types: dict[str, str],
    failed_at: dict[tuple[str, int], float],
) -> list[Sample]:
    """Each retry's delay, bracketed between when its task failed and when
    its due time was read; each retry is then made due at once."""
    samples: list[Sample] = []
    retried: dict[str, int] = defaultdict(int)
    with anyio.fail_after(60):
        while len(samples) < len(types) * (ATTEMPTS - 1):
            for task_id, task_type in types.items():
                due = await client.zscore(KEYS.delayed, task_id)
                if due is None:
                    continue  # running, or not failed yet
                read_at = await server_ms(client)
                retried[task_id] += 1
                attempt = retried[task_id]
                failed = failed_at[task_id, attempt]
                samples.append(
                    Sample(task_type, attempt, due - read_at - 1.5, due - failed + 0.5)
                )
                # Due now: the consumer claims it again at once.
                assert await client.zadd(KEYS.delayed, {task_id: 0}, xx=True, ch=True)
                await client.rpush(KEYS.wake, "1")
            await anyio.sleep(0.005)
    return samples


def report(samples: list[Sample]) -> None:
    """The figures this test measures, per type and attempt."""
    for key in sorted({(s.task_type, s.attempt) for s in samples}):
        some = [s for s in samples if (s.task_type, s.attempt) == key]
        print(  # noqa: T201 - the figures this test reports
            f"[backoff] {key[0]} retry after attempt {key[1]}: "
            f"{min(s.low_ms for s in some) / 1000:.2f}-"
            f"{max(s.high_ms for s in some) / 1000:.2f} s over {len(some)} tasks, "
            f"before jitter {some[0].expected_ms() / 1000:.0f} s, bracket <= "
            f"{max(s.high_ms - s.low_ms for s in some):.0f} ms"
        )


async def test_retry_delays_grow_are_capped_jittered_and_follow_the_override(
    redis_client: redis.asyncio.Redis,
) -> None:
    failed_at: dict[tuple[str, int], float] = {}

    async def fail() -> None:
        task = aiogroupq.current_task()
        failed_at[task.id, task.attempt] = await server_ms(redis_client)
        raise Boom

    handlers: dict[str, Any] = {
        "plain": fail,
        "tuned": aiogroupq.Handler(
            fail, retry_backoff=TUNED_BASE, retry_backoff_max=TUNED_CAP
        ),
    }
    async with (
        aiogroupq.Producer(redis_client, queue=QUEUE) as producer,
        aiogroupq.Consumer(
            redis_client,
            queue=QUEUE,
            handlers=handlers,
            retry_backoff=BASE,
            retry_backoff_max=CAP,
        ),
    ):
        types = {}
        for task_type in ("plain", "tuned"):
            for n in range(TASKS_PER_TYPE):
                group = f"g{n}" if n % 2 else None  # grouped retries hold the group
                task_id = await producer.enqueue(
                    task_type, group=group, max_attempts=ATTEMPTS
                )
                types[task_id] = task_type
        samples = await sample_retries(redis_client, types, failed_at)
        for task_id in types:
            with anyio.fail_after(30):
                while await producer.status(task_id) is not aiogroupq.TaskState.DEAD:
                    await anyio.sleep(0.01)

    factors = []
    for s in samples:
        expected = s.expected_ms()
        factors.append((s.low_ms / expected, s.high_ms / expected))
        # Growth, cap and override: the delay lies within [0.5, 1] x expected.
        assert s.high_ms >= 0.5 * expected, s
        assert s.low_ms <= expected, s
    report(samples)
    # Every (task, attempt) retried exactly once, per type.
    per_type = {
        t: sorted(s.attempt for s in samples if s.task_type == t)
        for t in types.values()
    }
    assert per_type == {
        t: sorted(list(range(1, ATTEMPTS)) * TASKS_PER_TYPE) for t in ("plain", "tuned")
    }
    # Jitter: the factors differ beyond what the brackets leave open.
    assert max(low for low, _ in factors) > min(high for _, high in factors), factors
