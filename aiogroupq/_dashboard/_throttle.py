"""Throttling of failed logins: guessing the token is slowed per client
address and over all addresses together.

- Per address: :data:`FREE_FAILURES` failed logins pass, then each further
  one locks the address out for twice as long as the one before (1 s, 2 s,
  4 s... up to :data:`MAX_LOCKOUT`). An address's failures are forgotten
  after a successful login, or :data:`FORGET_AFTER` seconds after its last
  one.
- Over all addresses (many clients, or one behind a proxy that gives every
  request the proxy's address): a bucket of :data:`GLOBAL_BURST` failures,
  refilled by one every :data:`GLOBAL_EVERY` seconds.

A login attempt while locked out is answered 429 with ``Retry-After``
and its token is not even compared: it teaches a guesser nothing. The
state is this process's: a restart starts afresh.
"""

from __future__ import annotations

__all__ = ("LoginThrottle",)

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: failed logins of one address before the lockouts begin
FREE_FAILURES: Final = 5
#: the longest lockout of one address, in seconds
MAX_LOCKOUT: Final = 300.0
#: seconds after its last failure that an address's failures are forgotten
FORGET_AFTER: Final = 900.0
#: failed logins over all addresses that may come at once
GLOBAL_BURST: Final = 30
#: seconds per failed login over all addresses, once the burst is spent
GLOBAL_EVERY: Final = 1.0
#: addresses remembered at most (the oldest is forgotten first)
MAX_ADDRESSES: Final = 10_000
# Doublings past which a lockout is MAX_LOCKOUT anyway: the exponent stops
# there (2.0 ** 1024 overflows after a few days of steady guessing).
_DOUBLINGS: Final = math.ceil(math.log2(MAX_LOCKOUT))


@dataclass(slots=True)
class _Failures:
    count: int
    last: float
    locked_until: float


class LoginThrottle:
    """Counts failed logins and says when the next attempt may be made.

    :param clock: the monotonic clock, in seconds (tests pass their own)
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._now = clock
        self._addresses: OrderedDict[str, _Failures] = OrderedDict()
        self._tokens = float(GLOBAL_BURST)
        self._refilled = clock()

    def retry_after(self, address: str) -> int:
        """Seconds until *address* may try a token again; 0: now."""
        now = self._now()
        self._refill(now)
        wait = 0.0
        if self._tokens < 1:
            wait = (1 - self._tokens) * GLOBAL_EVERY
        failures = self._addresses.get(address)
        if failures is not None:
            wait = max(wait, failures.locked_until - now)
        return math.ceil(wait) if wait > 0 else 0

    def failed(self, address: str) -> None:
        """Record a failed login of *address*."""
        now = self._now()
        self._refill(now)
        self._tokens = max(0.0, self._tokens - 1)
        failures = self._addresses.pop(address, None)
        if failures is None or now - failures.last > FORGET_AFTER:
            failures = _Failures(0, now, now)
        failures.count += 1
        failures.last = now
        beyond = failures.count - FREE_FAILURES
        if beyond > 0:
            lockout = 2.0 ** min(beyond - 1, _DOUBLINGS)
            failures.locked_until = now + min(MAX_LOCKOUT, lockout)
        self._addresses[address] = failures  # now the newest
        while len(self._addresses) > MAX_ADDRESSES:
            self._addresses.popitem(last=False)

    def succeeded(self, address: str) -> None:
        """Forget *address*'s failures: it knows the token."""
        self._addresses.pop(address, None)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._refilled)
        self._tokens = min(float(GLOBAL_BURST), self._tokens + elapsed / GLOBAL_EVERY)
        self._refilled = now
