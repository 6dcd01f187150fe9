"""Times the server wrote, read against the test's clock."""

from __future__ import annotations


def near(
    value: float | None, target: float, slack: float = 5.0, stall: float = 30.0
) -> bool:
    """*value* is *target* give or take *slack*, or up to *stall* seconds
    older: *target* is read after *value* was written, and a busy machine
    may pause between the two."""
    return value is not None and target - slack - stall <= value <= target + slack
