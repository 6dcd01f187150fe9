"""A producer and an admin of one queue, for the tests of the views and the
operator commands (the ``both`` fixture in conftest.py)."""

from __future__ import annotations

import aiogroupq

#: what the ``both`` fixture yields
Both = tuple[aiogroupq.Producer, aiogroupq.Admin]
