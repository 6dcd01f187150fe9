"""Real envelopes for tests that drive the scripts directly."""

from __future__ import annotations

import msgspec

from aiogroupq._store.codec import pack
from aiogroupq.task import Envelope


def envelope_of(task_id: str, group: str | None = None) -> bytes:
    """A valid envelope that names its task (so a claim's reply can be
    checked against it, and the consistency check decodes it)."""
    return pack(
        Envelope(id=task_id, type="t", payload=msgspec.Raw(b"\xc0"), group=group)
    )
