"""The start of a payload read from the first bytes of its envelope (the
dashboard's dead letters): the text of a whole envelope is the payload's
JSON, a cut one is a prefix of it ending in "…", and no bytes make it
raise (a dead letter's bytes may be exactly why it died).
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
import redis.asyncio

import aiogroupq
from aiogroupq._inspect import preview as _preview
from aiogroupq._store import codec, scripts as _scripts
from aiogroupq._store.keys import QueueKeys
from aiogroupq.task import Envelope

PAYLOADS: list[Any] = [
    {"account": "iban-DE89370400440532013000", "n": 1},
    [1, -1, 200, -200, 70_000, -70_000, 2**40, -(2**40), 2**64 - 1],
    {"nested": {"a": [None, True, False, 0.5, -2.25]}, "é": "ünïcødé ✓ 🎉"},
    "a plain string",
    "x" * 70_000,
    list(range(300)),
    {str(i): i for i in range(40)},
    [],
    {},
    0,
    None,
]


def _envelope(payload: Any) -> bytes:
    return codec.pack(
        Envelope(
            id="0" * 28,
            type="work",
            payload=codec.encode_payload(payload),
            group="g",
            max_attempts=3,
        )
    )


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_a_whole_envelope_shows_its_payload_as_json(payload: Any) -> None:
    whole = json.dumps(payload, ensure_ascii=False)
    assert _preview.preview(_envelope(payload), width=10**6) == whole
    # Cut by the width: a prefix of it, marked.
    shown = _preview.preview(_envelope(payload), width=20)
    if len(whole) > 40:
        assert shown.endswith("…")
        assert whole.startswith(shown[:-1])


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_every_cut_of_an_envelope_shows_a_prefix_of_its_payload(payload: Any) -> None:
    data = _envelope(payload)[: _preview.ENVELOPE_BYTES]
    whole = json.dumps(payload, ensure_ascii=False)
    for end in range(len(data) + 1):
        shown = _preview.preview(data[:end], width=10**6)
        if shown in ("…", whole):
            continue
        assert shown.endswith("…"), (end, shown)
        assert whole.startswith(shown[:-1]), (end, shown)


def test_bytes_and_extensions_are_described() -> None:
    payload = msgspec.msgpack.encode([b"\x00\x01", msgspec.msgpack.Ext(5, b"abc")])
    data = codec.pack(Envelope("i", "t", msgspec.Raw(payload)))
    assert _preview.preview(data) == '["AAE=", <ext 5: 3 bytes>]'


def test_any_bytes_give_some_text() -> None:
    rng = random.Random(7)
    samples = [b"", b"\xc1", b"\x93\xa1i\xa1t\xc1", b"\x93\xa1i", b"not msgpack"]
    samples += [rng.randbytes(rng.randrange(1, 64)) for _ in range(2000)]
    samples += [
        b"\x93\xa1i\xa1t" + rng.randbytes(rng.randrange(64)) for _ in range(2000)
    ]
    deep = b"\x93\xa1i\xa1t" + b"\x91" * 5000
    for data in [*samples, deep]:
        assert isinstance(_preview.preview(data), str)
    assert _preview.preview(b"not msgpack") == "?"


async def test_the_preview_reads_a_bounded_prefix_of_each_envelope(
    redis_client: redis.asyncio.Redis,
) -> None:
    queue = "preview"
    keys = QueueKeys(queue)
    async with aiogroupq.Producer(redis_client, queue=queue) as producer:
        big = await producer.enqueue("work", {"blob": "y" * 400_000})
        small = await producer.enqueue("work", {"n": 1})
    await redis_client.hset(keys.task("damaged"), "s", "dead")  # no envelope
    ids = [big, small, "damaged", "missing"]
    heads = await _scripts.dead_previews(redis_client, keys, ids, 100)
    assert [None if h is None else len(h) for h in heads[2:]] == [None, None]
    assert heads[0] is not None
    assert len(heads[0]) == 100
    whole: Any = await redis_client.hget(keys.task(small), "e")
    assert heads[1] == whole
    async with aiogroupq.Admin(redis_client, queue=queue) as admin:
        shown = await admin.payload_previews(*ids)
        with pytest.raises(aiogroupq.InvalidTaskError):
            await admin.payload_previews("")  # not a task id: nothing read
    assert shown[small] == '{"n": 1}'
    assert shown[big].startswith('{"blob": "yyyy')
    assert shown[big].endswith("…")
    assert len(shown[big]) < 1000  # of a 400,000-byte payload
    assert (shown["damaged"], shown["missing"]) == ("", "")
