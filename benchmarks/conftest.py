"""Collect only the smoke test here, never the libraries installed under .venvs."""

from __future__ import annotations

collect_ignore_glob = [".venvs/*", ".results/*", "peers/*"]
