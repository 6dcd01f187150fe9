"""Per-library virtual environments under ``benchmarks/.venvs/<name>``.

The peers' redis-py pins conflict (arq needs redis < 6, saq's redis extra < 8,
taskiq-redis >= 8), so each library gets its own environment, created with the
runner's interpreter and installed from the package index with pip. An
environment is reused while its requirements (and, for aiogroupq, this
repository's ``pyproject.toml``) are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "benchmarks" / ".venvs"

#: pinned so that a rerun measures the same code; bump deliberately. Every
#: redis-py based peer gets hiredis (arq, saq and aiogroupq ask for it anyway).
#: for ``--loop uvloop``, in every environment alike
UVLOOP = "uvloop==0.23.0"
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "aiogroupq": (UVLOOP, "-e", str(ROOT)),
    "arq": ("arq==0.28.0", UVLOOP),
    # saq's ``redis`` extra pins redis < 8; it imports typing_extensions without
    # declaring it.
    "saq": ("saq[redis,hiredis]==0.26.4", "typing_extensions", UVLOOP),
    "streaq": ("streaq==7.2.0", UVLOOP),
    "taskiq-redis": ("taskiq-redis==1.2.4", "taskiq==0.13.0", "redis[hiredis]", UVLOOP),
}


@dataclass(frozen=True, slots=True)
class Env:
    """One ready environment."""

    name: str
    python: Path
    #: ``KEY=VALUE`` options the runner passes to the adapter (``--option``)
    options: tuple[str, ...] = ()


def _stamp(name: str) -> str:
    parts = [sys.version, *REQUIREMENTS[name]]
    if name == "aiogroupq":
        parts.append(hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest())
    return json.dumps(parts)


def _python(path: Path) -> Path:
    return path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def ensure(name: str, *, install: bool = True) -> Env:
    """Create or reuse the environment of *name*; install its requirements."""
    path = VENVS / name
    stamp_file = path / ".bench-stamp"
    stamp = _stamp(name)
    exe = _python(path)
    if exe.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return Env(name, exe)
    if not install:
        raise RuntimeError(f"{path} is missing or stale; run without --no-install")
    print(f"* preparing {path} ({' '.join(REQUIREMENTS[name])})", file=sys.stderr)
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run(
        [
            str(exe),
            "-m",
            "pip",
            "install",
            "-qq",
            "--disable-pip-version-check",
            *REQUIREMENTS[name],
        ],
        check=True,
    )
    stamp_file.write_text(stamp)
    return Env(name, exe)
