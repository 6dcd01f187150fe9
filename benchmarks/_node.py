"""BullMQ's Node.js packages in ``benchmarks/.venvs/bullmq/node_modules``.

BullMQ is the one peer that is not Python: its adapter
(``benchmarks/peers/bullmq.py``) runs with the runner's own interpreter and
drives ``benchmarks/peers/bullmq.mjs`` with ``node``. The packages are
installed with ``npm install`` into the folder the Python peers' environments
live in, and reused while the pinned version and the Node.js version are
unchanged (BullMQ's MessagePack dependency may load a native add-on built for
one Node.js ABI).

Without ``node`` or ``npm``, or when the install fails (no network), the peer
is skipped with a reason: :class:`Unavailable`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks._venvs import VENVS, Env

#: pinned so that a rerun measures the same code; bump deliberately. The last
#: 5.x: its Redis client (ioredis) is a dependency, where 6.x makes the
#: client a choice of the application.
BULLMQ_VERSION = "5.81.5"
#: ``$BENCH_NODE_DIR`` moves it (the tests install into a folder of their own)
NODE_DIR = Path(os.environ.get("BENCH_NODE_DIR") or VENVS / "bullmq")
SCRIPT = Path(__file__).resolve().parent / "peers" / "bullmq.mjs"
_INSTALL_TIMEOUT = 600.0


class Unavailable(Exception):
    """BullMQ cannot run here; the message says why (printed, not raised on)."""


def _tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        raise Unavailable("node (Node.js) is not on PATH")
    if npm is None:
        raise Unavailable("npm is not on PATH")
    return node, npm


def _node_version(node: str) -> str:
    try:
        done = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"`{node} --version` failed: {exc}") from exc
    return done.stdout.strip()


def _installed(stamp: str) -> bool:
    stamp_file = NODE_DIR / ".bench-stamp"
    return (
        (NODE_DIR / "node_modules" / "bullmq" / "package.json").exists()
        and stamp_file.exists()
        and stamp_file.read_text() == stamp
    )


def registry_reachable(timeout: float = 20.0) -> str | None:
    """``None`` when npm can reach its registry for the pinned BullMQ, else why
    not; quick, so a test can skip instead of waiting for a whole install."""
    try:
        _, npm = _tools()
        subprocess.run(
            [
                npm,
                "view",
                f"bullmq@{BULLMQ_VERSION}",
                "version",
                "--fetch-retries=0",
                f"--fetch-timeout={int(timeout * 1000)}",
            ],
            capture_output=True,
            timeout=timeout + 5,
            check=True,
        )
    except Unavailable as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the npm registry is not reachable ({type(exc).__name__})"
    return None


def is_installed() -> bool:
    """Whether the pinned BullMQ is installed for this Node.js already."""
    try:
        node, _ = _tools()
        return _installed(json.dumps([BULLMQ_VERSION, _node_version(node)]))
    except Unavailable:
        return False


def ensure(*, install: bool = True) -> Env:
    """The ready BullMQ peer: the runner's interpreter (the adapter uses the
    standard library only) and the options that point it at ``node`` and the
    installed packages. Raises :class:`Unavailable` with the reason."""
    node, npm = _tools()
    stamp = json.dumps([BULLMQ_VERSION, _node_version(node)])
    options = (f"node={node}", f"node_dir={NODE_DIR}")
    if _installed(stamp):
        return Env("bullmq", Path(sys.executable), options)
    if not install:
        raise Unavailable(f"{NODE_DIR} is missing or stale (--no-install given)")
    print(
        f"* preparing {NODE_DIR} (npm install bullmq@{BULLMQ_VERSION})",
        file=sys.stderr,
    )
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    package = {
        "name": "aiogroupq-bench-bullmq",
        "private": True,
        "description": "installed by benchmarks/_node.py; never committed",
        "dependencies": {"bullmq": BULLMQ_VERSION},
    }
    (NODE_DIR / "package.json").write_text(json.dumps(package, indent=1) + "\n")
    argv = [
        npm,
        "install",
        "--no-audit",
        "--no-fund",
        "--no-progress",
        "--loglevel=error",
        "--fetch-retries=1",
        "--fetch-timeout=60000",
    ]
    try:
        done = subprocess.run(
            argv,
            cwd=NODE_DIR,
            check=False,
            capture_output=True,
            text=True,
            timeout=_INSTALL_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"npm install bullmq@{BULLMQ_VERSION} failed: {exc}") from exc
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise Unavailable(
            f"npm install bullmq@{BULLMQ_VERSION} failed (exit {done.returncode}): "
            + " / ".join(lines[-3:])
        )
    (NODE_DIR / ".bench-stamp").write_text(stamp)
    return Env("bullmq", Path(sys.executable), options)
