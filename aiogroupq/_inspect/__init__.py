"""Read-only views of a queue for the operator: stats, groups, tasks,
consumers, why something waits, start estimates, and their text rendering.
Imports only the face and ``_store``; writes nothing."""
