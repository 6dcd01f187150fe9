"""The consumer's machinery: claim and hand out, run each attempt under its
lease, record outcomes, renew leases, watch the event loop. Wired by
:mod:`aiogroupq.consumer`; imports the face, ``_store`` and ``_telemetry``."""
