"""Stored text made safe to print on a terminal.

Task ids, group names, task types, errors, tracebacks and consumer names are
whatever a producer, a handler or anything with access to Redis wrote: an
ESC in a group name would be a terminal escape sequence once printed
(recolouring, moving the cursor, rewriting what was printed before, setting
the window title), a CR would overwrite its own line. Every human-readable
line the command line prints passes through :func:`printable`, which shows
such characters the way Python writes them in a string (``\\x1b``, ``\\r``,
``\\u202e``) and keeps every printable character, Unicode included.
"""

from __future__ import annotations

__all__ = ("json_printable", "printable")

from typing import Final

#: the escapes everyone reads at a glance; any other is ``\x..`` and kin
_SHORT: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if (short := _SHORT.get(char)) is not None:
        return short
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """*text* with every character a terminal could act on shown escaped
    (``\\x1b``), but those in *keep* (``"\\n"`` for a traceback's lines).

    Printable characters, Unicode included, are kept as they are; a
    backslash is kept too, so escaping twice changes nothing.
    """
    if text.isprintable():  # the common case: nothing to look at
        return text
    return "".join(
        char if char.isprintable() or char in keep else _escape(char) for char in text
    )


def json_printable(text: str) -> str:
    """JSON text with every unprintable character but the line breaks of its
    layout written as a JSON ``\\uXXXX`` escape: the same JSON, with nothing
    a terminal acts on (an encoder leaves U+0085, the C1 controls and the
    format characters as they are)."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char == "\n":
            out.append(char)
            continue
        code = ord(char)
        if code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:  # a surrogate pair, as JSON writes one
            code -= 0x10000
            out.append(
                f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
            )
    return "".join(out)
