"""Fuzzing what Redis hands back: random and mutated bytes where a task's
envelope, payload and result are stored.

Two layers:

- hypothesis drives every decoding path directly (the runner, the read
  APIs' decoders, the encoder): only our typed outcomes come out;
- a real consumer claims thousands of tasks whose stored envelope was
  overwritten with random bytes: it never crashes, every task ends in a
  terminal state with a reason, and every read API answers.

Sizes: ``AIOGROUPQ_FUZZ_EXAMPLES`` (hypothesis examples per test, default
200) and ``AIOGROUPQ_FUZZ_N`` (tasks in the consumer run, default 1,000);
``AIOGROUPQ_FUZZ_SEED`` replays one consumer run.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio
from hypothesis import HealthCheck, given, settings, strategies as st

import aiogroupq
from aiogroupq import TaskState
from aiogroupq._store import scripts as _scripts
from aiogroupq._store.codec import (
    EncodeFailure,
    dead_letter,
    decode_result,
    encode_payload,
    pack,
    payload_decoder,
)
from aiogroupq._store.keys import QueueKeys
from aiogroupq._store.queries import DeadRow
from aiogroupq._work.handlers import build_routes
from aiogroupq._work.runner import RetryPolicy, run_task
from aiogroupq._work.running import Running
from aiogroupq.task import DeadLetter, Envelope

EXAMPLES = int(os.environ.get("AIOGROUPQ_FUZZ_EXAMPLES", "200"))
N = int(os.environ.get("AIOGROUPQ_FUZZ_N", "1000"))
QUEUE = "fuzz"
KEYS = QueueKeys(QUEUE)
TERMINAL = (TaskState.SUCCEEDED, TaskState.DEAD, TaskState.CANCELLED)
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Point(msgspec.Struct):
    x: int
    y: int


@dataclasses.dataclass
class Checked:
    n: int

    def __post_init__(self) -> None:
        if self.n < 0:
            raise KeyError(self.n)  # a user's own exception, not msgspec's


async def _echo(payload: Any) -> Any:
    return payload


async def _point(payload: Point) -> Point:
    return payload


async def _ints(payload: list[int]) -> int:
    return sum(payload)


async def _checked(payload: Checked) -> None:
    del payload


HANDLERS: dict[str, Any] = {
    "h": aiogroupq.Handler(_echo, store_result=True),
    "p": aiogroupq.Handler(_point, store_result=True, on_dead="halt"),
    "l": _ints,
    "c": _checked,
}
ROUTES = build_routes(HANDLERS)
# The consumer run keeps every group going: a halted group (on_dead="halt")
# would hold its later tasks until an operator acts, by design.
CONSUMER_HANDLERS = {**HANDLERS, "p": aiogroupq.Handler(_point, store_result=True)}

# -- inputs ----------------------------------------------------------------------

json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def valid_envelopes() -> st.SearchStrategy[bytes]:
    """Envelopes a producer could write, of every handler's type."""
    return st.builds(
        lambda task_type, payload, group, attempts, timeout: pack(
            Envelope(
                id="0" * 28,
                type=task_type,
                payload=msgspec.Raw(msgspec.msgpack.encode(payload)),
                group=group,
                max_attempts=attempts,
                timeout_ms=timeout,
            )
        ),
        st.sampled_from([*HANDLERS, "unknown"]),
        json_like
        | st.builds(
            lambda x, y: {"x": x, "y": y},
            st.integers(-(2**63), 2**63 - 1),
            st.integers(-(2**63), 2**63 - 1),
        ),
        st.none() | st.text(min_size=1, max_size=8),
        st.integers(1, 5),
        st.none() | st.integers(1_000, 10_000),
    )


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """*base* bytes with a few random edits: flips, cuts, insertions, invalid
    UTF-8, deep nesting."""
    data = bytearray(draw(base))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["flip", "cut", "insert", "utf8", "deep"]))
        if edit == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif edit == "cut":
            del data[at : at + draw(st.integers(1, 8))]
        elif edit == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif edit == "utf8":
            data[at:at] = b"\xa2\xc3\x28"  # a 2-byte str that is not UTF-8
        elif edit == "deep":
            data[at:at] = draw(st.sampled_from([b"\x91", b"\x81\x00"])) * draw(
                st.integers(400, 3_000)
            )
    return bytes(data)


stored_bytes = (
    st.binary(max_size=300)
    | valid_envelopes()
    | mutated(valid_envelopes())
    | json_like.map(msgspec.msgpack.encode)  # valid MessagePack, wrong shape
)

# -- direct: every decoding path ----------------------------------------------------


def run_offline(envelope: bytes) -> list[tuple[_scripts.Outcome, DeadLetter | None]]:
    """Run the consumer's task runner on *envelope*, without Redis."""
    submitted: list[tuple[_scripts.Outcome, DeadLetter | None]] = []

    def submit(outcome: _scripts.Outcome, notice: DeadLetter | None) -> None:
        submitted.append((outcome, notice))

    policy = RetryPolicy(0.01, 0.01)

    async def main() -> None:
        running = Running(_scripts.Claimed("t", envelope, attempt=1, token=1))
        await run_task(running, ROUTES, policy, submit, max_payload_bytes=64 * 1024)

    anyio.run(main)
    return submitted


def test_runner_gives_any_stored_bytes_exactly_one_outcome() -> None:
    tried, untyped, kinds = 0, 0, dict.fromkeys(("ok", "retry", "dead", "halt"), 0)

    @FUZZ_SETTINGS
    @given(stored_bytes)
    def check(envelope: bytes) -> None:
        nonlocal tried, untyped
        tried += 1
        try:
            submitted = run_offline(envelope)
        except BaseException:
            untyped += 1
            raise
        assert len(submitted) == 1, submitted
        outcome, notice = submitted[0]
        kinds[outcome.kind] += 1
        if outcome.kind in ("dead", "halt"):
            assert isinstance(outcome.arg1, str)
            assert outcome.arg1
            assert not outcome.arg1.startswith("InternalError"), outcome.arg1
            assert notice is not None
            assert notice.reason == outcome.arg1

    try:
        check()
    finally:
        print(f"\n[fuzz runner] inputs {tried}, untyped {untyped}, outcomes {kinds}")  # noqa: T201


def test_read_decoders_raise_only_typed_errors() -> None:
    tried, untyped = 0, 0
    result_types: list[Any] = [Any, int, Point, list[int], Checked, bytes]

    @FUZZ_SETTINGS
    @given(stored_bytes, stored_bytes, st.sampled_from(result_types))
    def check(envelope: bytes, result: bytes, result_type: Any) -> None:
        nonlocal tried, untyped
        tried += 1
        try:
            row = DeadRow("t", 0.0, envelope, "why", "", 1)
            letter = dead_letter(row)
            assert letter.reason == "why"
            reason = "decoded"
            try:
                decode_result("t", result, result_type)
            except aiogroupq.InvalidResultError as exc:
                reason = exc.reason
            assert reason
        except BaseException:
            untyped += 1
            raise

    try:
        check()
    finally:
        print(f"\n[fuzz read decoders] inputs {tried}, untyped {untyped}")  # noqa: T201


def test_encoder_refuses_only_with_its_typed_error() -> None:
    tried, untyped, refused = 0, 0, 0
    nested = st.integers(1, 3_000).map(lambda depth: _nested(depth))

    @FUZZ_SETTINGS
    @given(json_like | nested | st.builds(object) | st.integers(2**64, 2**80))
    def check(value: Any) -> None:
        nonlocal tried, untyped, refused
        tried += 1
        try:
            try:
                encoded = encode_payload(value)
            except EncodeFailure as exc:
                refused += 1
                why = str(exc)
                assert why
                return
            # Whatever is accepted decodes back.
            payload_decoder(Any).decode(encoded)
        except BaseException:
            untyped += 1
            raise

    try:
        check()
    finally:
        print(  # noqa: T201
            f"\n[fuzz encoder] inputs {tried}, refused {refused}, untyped {untyped}"
        )


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


# -- through Redis and a real consumer -------------------------------------------------


def garbage(rng: random.Random, valid: bytes) -> bytes:
    """One stored envelope: random, mutated, deep, non-UTF-8, wrong-shaped,
    or (about 1 in 8) left as the producer wrote it."""
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 64))
    if kind in (1, 2):
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(data) + 1)
            op = rng.randrange(3)
            if op == 0 and at < len(data):
                data[at] = rng.randrange(256)
            elif op == 1:
                del data[at : at + rng.randrange(1, 8)]
            else:
                data[at:at] = rng.randbytes(rng.randrange(1, 8))
        return bytes(data)
    if kind == 3:
        return rng.choice([b"\x91", b"\x81\xa1k"]) * rng.randrange(300, 3_000)
    if kind == 4:
        at = rng.randrange(len(valid) + 1)
        return valid[:at] + b"\xa2\xc3\x28" + valid[at:]
    if kind == 5:
        shape = rng.choice([{"a": 1}, [1, 2, 3], "text", None, [valid]])
        return msgspec.msgpack.encode(shape)
    if kind == 6:  # a valid envelope whose payload was damaged
        payload = rng.randbytes(rng.randrange(1, 16))
        return pack(
            Envelope(id="x", type=rng.choice(["h", "p"]), payload=msgspec.Raw(payload))
        )
    return valid


async def test_consumer_survives_thousands_of_random_envelopes(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    seed = int(os.environ.get("AIOGROUPQ_FUZZ_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    print(f"\n[fuzz consumer] AIOGROUPQ_FUZZ_SEED={seed}")  # noqa: T201 - to replay
    async with aiogroupq.Producer(redis_client, queue=QUEUE) as producer:
        ids: list[str] = []
        for start in range(0, N, 500):
            ids += await producer.enqueue_many(
                aiogroupq.Task(
                    rng.choice(["h", "p"]),
                    {"x": n, "y": -n},
                    group=None if n % 3 == 0 else f"g{n % 17}",
                )
                for n in range(start, min(N, start + 500))
            )
        async with redis_client.pipeline(transaction=False) as pipe:
            for task_id in ids:
                pipe.hget(KEYS.task(task_id), "e")
            valid_envelopes = await pipe.execute()
        async with redis_client.pipeline(transaction=False) as pipe:
            for task_id, valid in zip(ids, valid_envelopes, strict=True):
                pipe.hset(KEYS.task(task_id), "e", garbage(rng, valid))
            await pipe.execute()

        # One consumer for the whole run: an exception out of its block is a
        # crash (its task group failed), and nothing restarts it.
        crashes: list[BaseException] = []
        states: dict[str, TaskState | None] = {}
        retried = 0
        with caplog.at_level(logging.ERROR, logger="aiogroupq"):
            try:
                async with aiogroupq.Consumer(
                    redis_client,
                    queue=QUEUE,
                    handlers=CONSUMER_HANDLERS,
                    concurrency=32,
                    retry_backoff=0.001,
                    retry_backoff_max=0.01,
                ) as consumer:
                    with anyio.fail_after(100):
                        pending = list(ids)
                        while pending:
                            await anyio.sleep(0.05)
                            for task_id in pending:
                                states[task_id] = await producer.status(task_id)
                            pending = [t for t in pending if states[t] not in TERMINAL]
                    # Still claiming after all that: a good task runs.
                    canary = await producer.enqueue("h", {"x": 1, "y": 2}, group="g1")
                    with anyio.fail_after(30):
                        while await producer.status(canary) is not TaskState.SUCCEEDED:
                            await anyio.sleep(0.01)
                    retried = consumer.stats.retried
            except Exception as exc:  # noqa: BLE001 - counted, then failed below
                crashes.append(exc)

        untyped: list[BaseException] = []
        async with aiogroupq.Admin(redis_client, queue=QUEUE) as admin:
            letters = await admin.dead_letters(limit=N + 10)
        dead = {letter.id: letter for letter in letters}
        for task_id in ids:
            try:
                assert await producer.status(task_id) in TERMINAL
                await producer.result(task_id, timeout=0)
            except aiogroupq.AiogroupqError:
                pass  # TaskFailedError, NoResultError, …: typed answers
            except Exception as exc:  # noqa: BLE001 - counted: the figure is 0
                untyped.append(exc)
        internal = [r for r in caplog.records if "internal error" in r.getMessage()]
    counted = {state: list(states.values()).count(state) for state in TERMINAL}
    print(  # noqa: T201
        f"[fuzz consumer] inputs {N}, dead-lettered "
        f"{counted[TaskState.DEAD]}, succeeded {counted[TaskState.SUCCEEDED]}, "
        f"cancelled {counted[TaskState.CANCELLED]}, retried {retried}, "
        f"crashes {len(crashes)}, internal errors "
        f"{len(internal)}, untyped {len(untyped)}"
    )
    assert crashes == []
    assert untyped == []
    assert internal == []
    assert all(state in TERMINAL for state in states.values())
    assert sorted(dead) == sorted(t for t, s in states.items() if s is TaskState.DEAD)
    for letter in letters:
        assert letter.reason, letter
        assert not letter.reason.startswith("InternalError"), letter.reason
