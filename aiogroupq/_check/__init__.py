"""The check and the repair: one reading of a queue's keys, the invariants
they must keep, each problem confirmed by a second reading, and the repairs
that rebuild what was found. Imports only the face and ``_store``."""
