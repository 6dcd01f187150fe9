"""The package's floor plan (docs/internals.md, "The wings"): which wing may
import which, and no import circle anywhere. Read from the source, so a new
import that breaks the plan fails here rather than in a reader's head."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize(
    ("wing", "forbidden"),
    [
        # Redis, Lua and partitions know nothing of who uses them.
        ("aiogroupq._store", {*ROLES, "aiogroupq._work", "aiogroupq._inspect",
                              "aiogroupq._cli", "aiogroupq._telemetry",
                              "aiogroupq._dashboard", "aiogroupq.testing"}),
        # The consumer's machinery is wired by the consumer, never the reverse.
        ("aiogroupq._work", {*ROLES, "aiogroupq._inspect", "aiogroupq._cli",
                             "aiogroupq._dashboard"}),
        ("aiogroupq._inspect", {*ROLES, "aiogroupq._cli", "aiogroupq._dashboard"}),
        ("aiogroupq._telemetry", {*ROLES, "aiogroupq._cli", "aiogroupq._inspect",
                                  "aiogroupq._dashboard"}),
        # Each role stands on the wings, never on another role.
        *(
            (role, {*ROLES - {role}, "aiogroupq._cli", "aiogroupq._dashboard",
                    "aiogroupq.testing"})
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
