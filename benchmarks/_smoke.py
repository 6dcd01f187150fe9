"""What the benchmarks' smoke tests share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_module(*argv: str, timeout: float = 300) -> str:
    """``python -m <argv>`` from the repository's root; its output, which
    the test fails with (its tail) unless it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        cwd=ROOT,
        check=False,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )
    text = done.stdout.decode(errors="replace")
    assert done.returncode == 0, text[-4000:]
    print(text)
    return text
