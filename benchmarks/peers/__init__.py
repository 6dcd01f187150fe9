"""One adapter per library, each run by that library's own virtual environment.

Every module here must import nothing but the standard library and its own
library: the peers' redis-py pins conflict (arq needs redis < 6, taskiq-redis
needs >= 8), so each runs in ``benchmarks/.venvs/<peer>``.
"""
