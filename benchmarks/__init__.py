"""aiogroupq's benchmark suite: aiogroupq side by side with arq, saq, streaq and
taskiq-redis on one throwaway Redis-protocol server.

Run ``python -m benchmarks`` (or ``nox -s bench``); ``--help`` lists the options.
Each library runs from its own virtual environment under ``benchmarks/.venvs``
(their redis-py pins conflict), so this package imports only the standard
library.
"""
