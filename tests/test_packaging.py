"""What the package tells about itself: version, license, classifiers, URLs."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import aiogroupq

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_version_option_prints_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "aiogroupq", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, f"aiogroupq {aiogroupq.__version__}\n")


def test_version_has_one_source() -> None:
    # pyproject takes it from aiogroupq/__init__.py, so the two cannot drift.
    assert "version" not in PYPROJECT
    assert "version" in PYPROJECT["dynamic"]
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|(a|b|rc)\d+)?", aiogroupq.__version__)
    assert importlib.metadata.version("aiogroupq") == aiogroupq.__version__


def test_license_file_matches_the_declared_license() -> None:
    assert PYPROJECT["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "aiogroupq developers" in text
    assert "LICENSE" in PYPROJECT["license-files"]


def test_no_classifier_promises_a_backend_we_do_not_run_on() -> None:
    # redis.asyncio is asyncio-only: "Framework :: AnyIO" would promise trio.
    assert "Framework :: AsyncIO" in PYPROJECT["classifiers"]
    assert "Framework :: AnyIO" not in PYPROJECT["classifiers"]
    assert "Framework :: Trio" not in PYPROJECT["classifiers"]


def test_project_urls_and_changelog() -> None:
    urls = PYPROJECT["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert f"## [{aiogroupq.__version__}]" in changelog
