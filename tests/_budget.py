"""The call budget of tests that stop, freeze or cut off a server of their
own (the ``short_budget`` and ``server`` fixtures of ``conftest.py``)."""

from __future__ import annotations

from typing import Final

#: seconds a client made from a URL spends on a call (the product's 5)
SHORT_BUDGET: Final = 1.0
