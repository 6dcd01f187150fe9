"""Every cap and default of the package, each defined once, so that a
consumer, the check, the views and a producer never disagree. It imports
nothing: every wing and :mod:`aiogroupq.errors` read it."""

from __future__ import annotations

from typing import Final

#: default ``max_payload_bytes``: 512 KiB of encoded MessagePack
DEFAULT_MAX_PAYLOAD_BYTES: Final = 512 * 1024
#: default ``max_attempts`` of a task
DEFAULT_MAX_ATTEMPTS: Final = 3
#: default deduplication window in seconds (SQS FIFO's)
DEFAULT_DEDUP_WINDOW: Final = 300.0
#: default retention of succeeded and cancelled tasks' states, in seconds
DEFAULT_RETENTION: Final = 3600.0
#: most tasks one ``enqueue_many`` call takes: one atomic script call stays
#: around 10 ms of Redis time
MAX_BATCH: Final = 1000
#: most outcomes one ``finish.lua`` call records (a consumer's finisher
#: sends what waits in calls of at most this many)
MAX_OUTCOMES_PER_CALL: Final = 256
#: default ``max_batch_bytes``: most bytes of encoded tasks one
#: ``enqueue_many`` call carries (8 MiB: about 20 ms of Redis time for the
#: script, 60 ms for the call, on loopback). Counting tasks alone let a batch
#: of 400 tasks of 512 KiB hold Redis for 1.8 s
DEFAULT_MAX_BATCH_BYTES: Final = 8 * 1024 * 1024
#: the longest delay a task (``delay``, ``run_at``) or a ``Retry`` may ask
#: for, in seconds: 365 days. A delayed task, and a ``unique`` dedup key it
#: holds, stay no longer than this
MAX_DELAY: Final = 365 * 24 * 3600.0
#: how long a replicated write waits for a replica's acknowledgement (ms)
REPLICA_WAIT_MS: Final = 2000
#: seconds after its claim was sent within which a task of a group may
#: start; later, it goes back unstarted. Pausing a group waits out this
#: window of the group's latest claim, so that nothing claimed before the
#: pause starts after it returns. It covers a replicated claim's wait for
#: its replica and leaves a second for a busy event loop.
START_WINDOW: Final = REPLICA_WAIT_MS / 1000 + 1.0
#: most slots (concurrency) a group may have
MAX_CONCURRENCY: Final = 10_000
#: highest weight of a group (``Admin.set_group(weight=)``); 1 is the default
MAX_WEIGHT: Final = 100
#: highest task priority (0 is the default; higher first)
MAX_PRIORITY: Final = 9
#: what an envelope adds to its payload at most: a 28-character id, a task
#: type and a group of at most 256 bytes each, a few integers, headers
ENVELOPE_OVERHEAD: Final = 1024
#: seconds of starts the claims' start counter keeps (``lib/starts.lua``)
STARTS_WINDOW: Final = 30
#: most fields of the start counter a claim sweeps (claims leave about two
#: windows' worth at most); a counter with more holds fields no claim wrote,
#: which the check reports (``stale-starts``) and its repair clears in slices
STARTS_MOST: Final = 4 * STARTS_WINDOW
