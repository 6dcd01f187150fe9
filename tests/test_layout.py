"""The package's floor plan (docs/internals.md, "The wings"): which wing may
import which, and no import circle anywhere. Read from the source, so a new
import that breaks the plan fails here rather than in a reader's head."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiogroupq"
ROLES = frozenset({"aiogroupq.producer", "aiogroupq.consumer", "aiogroupq.admin"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every module of the package that ``name`` imports, wherever the
    statement stands (a function, ``if TYPE_CHECKING:``), as dotted names."""
    here = name.split(".") if _is_package(path) else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            # ``from pkg import mod`` imports a module; ``from mod import x`` a name.
            targets = [f"{source}.{a.name}" for a in node.names]
            targets = [t if t in known else source for t in targets]
        else:
            continue
        yield from (t for t in targets if t in known and t != name)


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: set(_imports(name, path, known)) for name, path in known.items()}


GRAPH = _graph()


def _wing(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def _circles() -> list[list[str]]:
    """The package's import circles: its strongly connected components of
    more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in GRAPH[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return circles


def test_the_graph_is_read() -> None:
    # A parser that found nothing would pass every rule below.
    assert "aiogroupq._store.scripts" in GRAPH["aiogroupq.producer"]
    assert "aiogroupq._work.runner" in GRAPH["aiogroupq.consumer"]


def test_no_import_circle() -> None:
    assert _circles() == []


def _offenders(wing: str, forbidden: set[str]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if _wing(module) == wing or module == wing
        for target in targets
        if target in forbidden or _wing(target) in forbidden
    )


WINGS = frozenset(
    {"aiogroupq._store", "aiogroupq._work", "aiogroupq._telemetry",
     "aiogroupq._inspect", "aiogroupq._check"}
)  # fmt: skip
FRONT = frozenset({"aiogroupq._cli", "aiogroupq._dashboard", "aiogroupq.testing"})


@pytest.mark.parametrize(
    ("wing", "forbidden"),
    [
        # Redis, Lua and partitions know nothing of who uses them.
        ("aiogroupq._store", {*ROLES, *WINGS - {"aiogroupq._store"}, *FRONT}),
        # The consumer's machinery is wired by the consumer, never the reverse.
        ("aiogroupq._work", {*ROLES, "aiogroupq._inspect", "aiogroupq._check",
                             *FRONT}),
        # Events and logs: every role and wing may use them.
        ("aiogroupq._telemetry", {*ROLES, *WINGS - {"aiogroupq._telemetry",
                                                    "aiogroupq._store"}, *FRONT}),
        # The read-only views and the check stand on _store alone.
        ("aiogroupq._inspect", {*ROLES, *WINGS - {"aiogroupq._inspect",
                                                  "aiogroupq._store"}, *FRONT}),
        ("aiogroupq._check", {*ROLES, *WINGS - {"aiogroupq._check",
                                                "aiogroupq._store"}, *FRONT}),
        # Each role stands on the wings, never on another role.
        *(
            (role, {*ROLES - {role}, *FRONT})
            for role in sorted(ROLES)
        ),
    ],
)  # fmt: skip
def test_wing_imports_only_what_it_may(wing: str, forbidden: set[str]) -> None:
    assert _offenders(wing, forbidden) == []


def test_nothing_in_the_library_imports_the_command_line() -> None:
    # Only the entry point itself (``python -m aiogroupq``) starts it.
    users = sorted(
        module
        for module, targets in GRAPH.items()
        if _wing(module) != "aiogroupq._cli"
        and module != "aiogroupq.__main__"
        and any(_wing(t) == "aiogroupq._cli" for t in targets)
    )
    assert users == []


def _defined_names(path: Path) -> Iterator[tuple[str, ast.expr | None]]:
    """The module-level names *path* assigns, with the value assigned."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id, node.value
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node.value


def _private_names_across_wings() -> list[str]:
    """``from <another wing> import _name``: a private name used where its
    wing cannot see (dunders such as ``__version__`` aside)."""
    known = _modules()
    found = []
    for name, path in known.items():
        here = name.split(".") if _is_package(path) else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here[: len(here) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source not in known or _wing(source) == _wing(name):
                continue
            found += [
                f"{name} imports {source}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_")
                and not alias.name.startswith("__")
                and f"{source}.{alias.name}" not in known
            ]
    return sorted(found)


def test_no_private_name_is_imported_across_wings() -> None:
    assert _private_names_across_wings() == []


_LIMIT = re.compile(r"_?(MAX|DEFAULT)_[A-Z0-9_]+")


def _limits_defined() -> dict[str, list[str]]:
    """Every module-level ``MAX_*``/``DEFAULT_*`` constant (a leading ``_``
    ignored), with the modules that define it; one assigned another such
    name (a second name for one fact) is listed under that name too."""
    where: dict[str, list[str]] = {}
    for module, path in sorted(_modules().items()):
        for name, value in _defined_names(path):
            if not _LIMIT.fullmatch(name):
                continue
            where.setdefault(name.lstrip("_"), []).append(module)
            if isinstance(value, ast.Name) and _LIMIT.fullmatch(value.id):
                where.setdefault(value.id.lstrip("_"), []).append(f"{module}.{name}")
    return where


def test_each_cap_and_default_is_defined_once() -> None:
    assert "DEFAULT_MAX_PAYLOAD_BYTES" in _limits_defined()  # the parser works
    twice = {name: at for name, at in _limits_defined().items() if len(at) > 1}
    assert twice == {}


#: most lines of a module; a role (a façade over the wings) may have a little more
MAX_MODULE_LINES = 750
MAX_ROLE_LINES = 800


def test_no_module_is_too_long() -> None:
    too_long = {
        name: lines
        for name, path in _modules().items()
        if (lines := len(path.read_text(encoding="utf-8").splitlines()))
        > (MAX_ROLE_LINES if name in ROLES else MAX_MODULE_LINES)
    }
    assert too_long == {}


def _private_wings() -> dict[str, Path]:
    return {
        name: path
        for name, path in _modules().items()
        if _is_package(path) and name.count(".") == 1 and name.split(".")[1][0] == "_"
    }


def test_each_wing_states_its_charter() -> None:
    wings = _private_wings()
    assert "aiogroupq._store" in wings
    vague = {}
    for name, path in wings.items():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        lines = doc.strip().splitlines()
        if not 2 <= len(lines) <= 3 or "placeholder" in doc.lower():
            vague[name] = doc
    assert vague == {}
