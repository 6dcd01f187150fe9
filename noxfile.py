"""Developer sessions. ``nox -s tests`` is what CI and the README run."""

from __future__ import annotations

import glob
import os
import shutil
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHONS = ["3.11", "3.12", "3.13", "3.14"]
PYPROJECT = nox.project.load_toml("pyproject.toml")


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


@nox.session(name="tests-lowest")
def tests_lowest(session: nox.Session) -> None:
    """The test suite with the lowest allowed version of every dependency,
    so that the floors in pyproject.toml stay true."""
    session.install("-e", ".[test]", *lowest_pins())
    session.run(
        "python",
        "-c",
        "from importlib.metadata import version as v; "
        "print('lowest:', *(f'{p} {v(p)}' for p in ('redis', 'anyio', 'msgspec')))",
    )
    session.run("pytest", *(session.posargs or ["-n", "auto", "-m", "not chaos"]))


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
    """Benchmarks beside arq, saq, streaq and taskiq-redis (docs/benchmarks.md).

    Arguments go to ``python -m benchmarks``, e.g.
    ``nox -s bench -- --quick --only aiogroupq``. Each library is installed into
    its own environment under ``benchmarks/.venvs`` on first use.
    """
    session.install("-e", ".[server]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """Kill -9 consumers, stall them, drop connections, restart and freeze
    Redis, flush its scripts, all under load, and print the figures.

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
