"""``python -m benchmarks``: see :mod:`benchmarks._runner`."""

from __future__ import annotations

from benchmarks._runner import main

if __name__ == "__main__":
    main()
