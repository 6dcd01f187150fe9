"""The code under test: a shop's task handlers."""

from __future__ import annotations

import msgspec

import aiogroupq


class Charge(msgspec.Struct):
    order_id: int
    amount_cents: int


class AmountError(ValueError):
    """A charge that no retry can fix."""


async def charge(payload: Charge) -> str:
    task = aiogroupq.current_task()  # id, group, attempt, ...
    if payload.amount_cents <= 0:
        raise AmountError(f"order {payload.order_id}: nothing to charge")
    return f"order {payload.order_id} charged for {task.group}"


HANDLERS = {
    # results kept for Producer.result(); AmountError dead-letters at once
    "charge": aiogroupq.Handler(charge, store_result=True, no_retry=(AmountError,)),
}
