"""A group's settings fields are named once (``_store/schema.py``): what
``Admin`` writes, what ``update_group`` names, and the order
``control.lua``'s "group" operation takes them in agree with it."""

from __future__ import annotations

import re
from pathlib import Path

from aiogroupq._store import settings as _settings
from aiogroupq._store.schema import GROUP_SETTINGS

LUA = Path(_settings.__file__).resolve().parents[1] / "_lua" / "control.lua"


def test_the_settings_fields_agree_everywhere() -> None:
    assert tuple(_settings.group_fields()) == GROUP_SETTINGS
    stored = tuple(f for fields in _settings.STORED_AS.values() for f in fields)
    assert stored == GROUP_SETTINGS
    # control.lua's own list of a group's settings fields, in its order
    found = re.search(r"local SETTINGS = \{([^}]*)\}", LUA.read_text())
    assert found is not None
    in_lua = tuple(re.findall(r"'(\w+)'", found.group(1)))
    assert in_lua == GROUP_SETTINGS
