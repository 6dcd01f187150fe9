"""MessagePack encoding of envelopes and payloads: one encoder, cached decoders.

Decoding reads bytes that anything with access to Redis may have written, so
callers treat *any* exception from a decoder as "these bytes are unusable"
(msgspec before 0.23 raises ``UnicodeDecodeError`` for invalid UTF-8, and
``RecursionError`` for deep nesting, not only its own errors):
:func:`describe_decode_error` turns each into a one-line reason.
"""

from __future__ import annotations

import functools
from itertools import chain, compress
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import InvalidResultError
from ..task import DeadLetter, Envelope

if TYPE_CHECKING:
    from .queries import DeadRow

#: deepest nesting of containers (arrays, maps, Structs, dataclasses, …) that a
#: payload or a stored result may have. msgspec's own limit is the
#: interpreter's recursion limit: on CPython 3.11 about 1,000 levels *minus
#: the depth of the calling stack*, 1,500 on 3.12, 10,000 on 3.13. A fixed
#: limit well below the smallest of these means that whatever one producer
#: accepts, every consumer can decode, whatever its Python and stack depth.
MAX_DEPTH: Final = 512

_encoder: Final = msgspec.msgpack.Encoder()
_envelope_decoder: Final = msgspec.msgpack.Decoder(Envelope)
_any_decoder: Final = msgspec.msgpack.Decoder()

# The first byte of every MessagePack array and map: fixmap, fixarray, then
# array 16/32 and map 16/32. Each level of nesting needs one, so their count
# bounds the depth from above.
_CONTAINER_HEADS: Final = frozenset([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES: Final = bytes(b for b in range(256) if b not in _CONTAINER_HEADS)
_is_container: Final = frozenset((list, dict, tuple)).__contains__


class EncodeFailure(Exception):
    """A value cannot be stored: MessagePack cannot encode it, or it nests
    deeper than :data:`MAX_DEPTH`. Callers turn it into their own error."""


def pack(envelope: Envelope) -> bytes:
    """Encode an envelope for Redis."""
    return _encoder.encode(envelope)


def unpack(data: bytes) -> Envelope:
    """Decode an envelope read from Redis.

    :raises Exception: any exception (see the module docstring) if the bytes
        are not a valid envelope
    """
    return _envelope_decoder.decode(data)


def out_of_range(envelope: Envelope) -> str:
    """What a producer never writes but well-formed bytes can hold ("" if
    nothing): a consumer's attempt logic relies on these bounds, and the
    check holds stored tasks to them."""
    if envelope.max_attempts < 1:
        return f"max_attempts is {envelope.max_attempts}, not >= 1"
    if envelope.timeout_ms is not None and envelope.timeout_ms < 1:
        return f"timeout_ms is {envelope.timeout_ms}, not >= 1"
    return ""


def encode_payload(payload: object) -> msgspec.Raw:
    """Encode a payload (or a handler's result) once; the envelope embeds it
    verbatim.

    :raises EncodeFailure: if MessagePack cannot encode it, or it nests deeper
        than :data:`MAX_DEPTH` levels
    """
    try:
        data = _encoder.encode(payload)
    except RecursionError:
        raise EncodeFailure(_too_deep()) from None
    except Exception as exc:
        # Any failure of the encoder (TypeError, OverflowError, EncodeError,
        # whatever a user's object raises while read) means "cannot store".
        raise EncodeFailure(str(exc) or type(exc).__name__) from exc
    if len(data) > MAX_DEPTH and _deeper_than_limit(data):
        raise EncodeFailure(_too_deep())
    return msgspec.Raw(data)


def _too_deep() -> str:
    return f"it is nested deeper than {MAX_DEPTH} levels"


def _deeper_than_limit(data: bytes) -> bool:
    # Fast path, one pass in C: fewer container headers than the limit means
    # the nesting cannot exceed it. Other bytes (string contents, integers)
    # can only make the count too high, never too low.
    if len(data.translate(None, _OTHER_BYTES)) <= MAX_DEPTH:
        return False
    # Exact, for values with many containers: decode to builtins and walk
    # them level by level, with the per-item work in C (chain, compress).
    try:
        level: list[Any] = [_any_decoder.decode(data)]
    except RecursionError:
        return True
    except Exception as exc:  # what a consumer would meet too
        raise EncodeFailure(
            f"the encoded value does not decode back: {describe_decode_error(exc)}"
        ) from exc
    depth = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return True
        maps = [node for node in level if type(node) is dict]
        seqs = [node for node in level if type(node) is not dict]
        children = list(
            chain(
                chain.from_iterable(maps),  # keys (arrays as keys are tuples)
                chain.from_iterable(map(dict.values, maps)),
                chain.from_iterable(seqs),
            )
        )
        level = list(compress(children, map(_is_container, map(type, children))))
    return False


def describe_decode_error(exc: BaseException) -> str:
    """One line saying why bytes did not decode (for a dead-letter reason)."""
    if isinstance(exc, msgspec.MsgspecError):
        return str(exc)  # already says what and where: "Expected `int`… at `$.a`"
    if isinstance(exc, RecursionError):
        return (
            f"nested too deeply to decode (at most {MAX_DEPTH} levels are "
            "accepted by the producer)"
        )
    return f"{type(exc).__name__}: {exc}"


@functools.cache
def payload_decoder(payload_type: Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder into *payload_type*, built once per type."""
    return msgspec.msgpack.Decoder(payload_type)


def decode_result(task_id: str, result: bytes, result_type: Any) -> Any:
    """A stored result decoded into ``result_type``, or a typed error naming the task."""
    decoder = payload_decoder(result_type)
    try:
        return decoder.decode(result)
    except Exception as exc:  # whatever the stored bytes are
        detail = describe_decode_error(exc)
        raise InvalidResultError(task_id, result_type, detail) from exc


def dead_letter(row: DeadRow) -> DeadLetter:
    """The public view of a stored dead letter, whatever its bytes are."""
    # A dead letter's bytes may be exactly why it died: whatever fails to
    # decode is shown as unknown ("?", None) rather than failing the listing.
    envelope: Envelope | None = None
    payload: Any = None
    try:
        envelope = unpack(row.envelope)
        payload = msgspec.msgpack.decode(envelope.payload)
    except Exception:  # noqa: BLE001, S110 - any stored bytes: see above
        pass
    return DeadLetter(
        id=row.id,
        type=envelope.type if envelope else "?",
        group=envelope.group if envelope else None,
        payload=payload,
        reason=row.reason,
        traceback=row.traceback,
        attempts=row.attempts,
        dead_at=row.dead_at_ms / 1000,
    )


def identity(envelope: Envelope) -> str:
    """What an ended task keeps of its envelope (the hash's ``i``): its enqueue
    time in ms, its payload's size in bytes and its type, written at enqueue
    so that ending a task reads nothing of its envelope."""
    return f"{envelope.enqueued_ms} {len(envelope.payload)} {envelope.type}"
