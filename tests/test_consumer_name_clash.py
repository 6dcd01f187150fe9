"""A consumer name held by another live consumer: the error the changelog
promises (``ConsumerRunningError``), still the ``ConfigurationError`` it
was."""

from __future__ import annotations

import anyio
import pytest
import redis.asyncio

import aiogroupq

QUEUE = "name-clash"
#: liveness only
PATIENCE = 30.0


async def test_a_live_consumers_name_is_a_consumer_running_error(
    redis_client: redis.asyncio.Redis,
) -> None:
    async def h() -> None:
        pass

    options = {"queue": QUEUE, "handlers": {"h": h}, "lease_ttl": 1.0}
    started = anyio.current_time()
    async with aiogroupq.Consumer(redis_client, name="dup", **options):  # type: ignore[arg-type]
        twin = aiogroupq.Consumer(redis_client, name="dup", **options)  # type: ignore[arg-type]
        with (
            anyio.fail_after(PATIENCE),
            pytest.raises(aiogroupq.ConsumerRunningError) as caught,
        ):
            async with twin:
                pass
    print(f"refused after {anyio.current_time() - started:.2f} s: {caught.value}")  # noqa: T201
    assert isinstance(caught.value, aiogroupq.ConfigurationError)
    assert caught.value.name == "dup"
    assert "another live consumer is named 'dup'" in str(caught.value)
