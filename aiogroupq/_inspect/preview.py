"""The first characters of payloads, read from the first bytes of their
envelopes: a page that shows a few dozen characters of each dead letter's
payload (the dashboard's) reads :data:`ENVELOPE_BYTES` of each, however
large the payloads are (``dead.lua``'s ``preview``), where decoding them
whole read every byte of every payload at each refresh.

A prefix of MessagePack does not decode, so :func:`preview` renders what it
holds itself, JSON-like (``{"account": "DE89…``), up to where the bytes or
the width end; whatever the bytes are, it never raises (they may be exactly
why the task died).
"""

from __future__ import annotations

__all__ = ("ENVELOPE_BYTES", "PAYLOAD_BYTES", "payload_previews", "preview")

import base64
import json
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from .._store.fanout import by_partition
from .._store.scripts import dead_previews

if TYPE_CHECKING:
    from .._store.connection import Client
    from .._store.partition import Partitions

#: bytes of a payload read at most: enough for a line of text whatever it
#: holds (a character of output takes at most a few bytes of MessagePack)
PAYLOAD_BYTES: Final = 1024
#: bytes of an envelope read at most: its head (the array's header, the id
#: and the type, at most 256 bytes) and then :data:`PAYLOAD_BYTES`
ENVELOPE_BYTES: Final = 512 + PAYLOAD_BYTES
#: characters rendered at most (a page cuts them shorter)
WIDTH: Final = 200
#: containers nested deeper than this are not opened
_DEEPEST: Final = 32
_MORE: Final = "…"


async def payload_previews(
    client: Client, parts: Partitions, task_ids: Sequence[str], width: int = WIDTH
) -> dict[str, str]:
    """The first *width* characters or so of each task's payload ("" for a
    task without an envelope), each read from :data:`ENVELOPE_BYTES` of its
    envelope."""
    out: dict[str, str] = {}
    for keys, ids in by_partition(parts, task_ids).items():
        heads = await dead_previews(client, keys, ids, ENVELOPE_BYTES)
        for task_id, head in zip(ids, heads, strict=True):
            out[task_id] = "" if head is None else preview(head, width)
    return out


class _End(Exception):
    """The bytes or the width ran out: what is rendered so far stands."""


class _Reader:
    """Renders MessagePack values from a prefix of their bytes."""

    def __init__(self, data: bytes, width: int) -> None:
        self.data = data
        self.at = 0
        self.width = width
        self.parts: list[str] = []
        self.size = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _End
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def number(self, n: int, signed: bool = False) -> int:
        return int.from_bytes(self.take(n), "big", signed=signed)

    def emit(self, text: str) -> None:
        room = self.width - self.size
        self.parts.append(text[:room])
        self.size += len(text)
        if self.size > self.width:
            raise _End

    def text(self, n: int) -> str:
        """A str of *n* bytes, as far as the bytes go."""
        rest = len(self.data) - self.at
        if n <= rest:
            return self.take(n).decode("utf-8", "replace")
        # Cut short: what there is (a character cut in two dropped), open.
        cut = self.take(rest).decode("utf-8", "ignore")
        self.emit(json.dumps(cut, ensure_ascii=False)[:-1])
        raise _End

    def string_length(self, head: int) -> int | None:
        """The length of a str whose first byte is *head*, None if not one."""
        if 0xA0 <= head <= 0xBF:
            return head & 0x1F
        if head in (0xD9, 0xDA, 0xDB):
            return self.number({0xD9: 1, 0xDA: 2, 0xDB: 4}[head])
        return None

    def value(self, depth: int) -> None:
        head = self.take(1)[0]
        if head <= 0x7F:
            self.emit(str(head))
        elif head >= 0xE0:
            self.emit(str(head - 0x100))
        elif 0x80 <= head <= 0x8F or head in (0xDE, 0xDF):
            n = head & 0x0F if head <= 0x8F else self.number(2 if head == 0xDE else 4)
            self.container(n, depth, mapping=True)
        elif 0x90 <= head <= 0x9F or head in (0xDC, 0xDD):
            n = head & 0x0F if head <= 0x9F else self.number(2 if head == 0xDC else 4)
            self.container(n, depth, mapping=False)
        elif (length := self.string_length(head)) is not None:
            self.emit(json.dumps(self.text(length), ensure_ascii=False))
        elif head in (0xC0, 0xC2, 0xC3):
            self.emit({0xC0: "null", 0xC2: "false", 0xC3: "true"}[head])
        elif head in (0xC4, 0xC5, 0xC6):  # bin: base64, as JSON shows bytes
            n = self.number({0xC4: 1, 0xC5: 2, 0xC6: 4}[head])
            rest = len(self.data) - self.at
            self.emit('"' + base64.b64encode(self.take(min(n, rest))).decode())
            if n > rest:
                raise _End
            self.emit('"')
        elif head in (0xCA, 0xCB):
            fmt, n = (">f", 4) if head == 0xCA else (">d", 8)
            self.emit(repr(struct.unpack(fmt, self.take(n))[0]))
        elif 0xCC <= head <= 0xD3:
            n = 1 << ((head - 0xCC) % 4)
            self.emit(str(self.number(n, signed=head >= 0xD0)))
        elif 0xD4 <= head <= 0xD8 or head in (0xC7, 0xC8, 0xC9):
            if head >= 0xD4:
                n = 1 << (head - 0xD4)
            else:
                n = self.number({0xC7: 1, 0xC8: 2, 0xC9: 4}[head])
            code = self.number(1, signed=True)
            self.emit(f"<ext {code}: {n} bytes>")
            self.take(n)
        else:  # 0xC1: never used
            self.emit("?")
            raise _End

    def container(self, n: int, depth: int, *, mapping: bool) -> None:
        if depth >= _DEEPEST:
            self.emit("{" if mapping else "[")
            raise _End
        self.emit("{" if mapping else "[")
        for i in range(n):
            if i:
                self.emit(", ")
            self.value(depth + 1)
            if mapping:
                self.emit(": ")
                self.value(depth + 1)
        self.emit("}" if mapping else "]")


def preview(envelope: bytes, width: int = WIDTH) -> str:
    """The payload of an envelope (or of the first bytes of one) as
    JSON-like text, cut after *width* characters or where the bytes end,
    with "…" then; ``"?"`` for bytes that are no envelope."""
    reader = _Reader(envelope, width)
    try:
        head = reader.take(1)[0]
        if not (0x92 <= head <= 0x9F or head in (0xDC, 0xDD)):
            return "?"  # an envelope is an array of 3 fields or more
        if head in (0xDC, 0xDD):
            reader.take(2 if head == 0xDC else 4)
        for _ in ("id", "type"):
            n = reader.string_length(reader.take(1)[0])
            if n is None:
                return "?"
            reader.take(n)
    except _End:
        return _MORE  # the head alone fills the bytes read
    try:
        reader.value(0)
    except _End:
        return "".join(reader.parts) + _MORE
    return "".join(reader.parts)
