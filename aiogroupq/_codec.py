"""MessagePack encoding of envelopes and payloads: one encoder, cached decoders."""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

from .task import Envelope

_encoder: Final = msgspec.msgpack.Encoder()
_envelope_decoder: Final = msgspec.msgpack.Decoder(Envelope)


def pack(envelope: Envelope) -> bytes:
    """Encode an envelope for Redis."""
    return _encoder.encode(envelope)


def unpack(data: bytes) -> Envelope:
    """Decode an envelope read from Redis.

    :raises msgspec.DecodeError: if the bytes are not a valid envelope
    """
    return _envelope_decoder.decode(data)


def encode_payload(payload: object) -> msgspec.Raw:
    """Encode a payload once, producer side; the envelope embeds it verbatim.

    :raises TypeError: if MessagePack cannot encode it (msgspec's own error)
    """
    return msgspec.Raw(_encoder.encode(payload))


@functools.cache
def payload_decoder(payload_type: Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder into *payload_type*, built once per type."""
    return msgspec.msgpack.Decoder(payload_type)
