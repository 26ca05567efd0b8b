"""The package's import graph, read from the source with ast: one way dependencies point, no circle.

Every import counts: at module level and inside functions (a lazy import is still a
dependency), but not one under ``if TYPE_CHECKING:`` (never run). Importing ``a.b.c`` runs
``a.b``'s ``__init__`` first, so it depends on that package too (the root package
``router`` aside, which only re-exports, and the packages a module itself belongs to,
which Python has started before it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROUTER = Path(__file__).resolve().parents[2] / "router"


def module_of(path: Path) -> str:
    parts = path.relative_to(ROUTER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for p in sorted(ROUTER.rglob("*.py"))}


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module *module*'s code imports, outside ``if TYPE_CHECKING:`` blocks."""
    def visit(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (n for c in child.orelse for n in [c, *visit(c)])
                continue
            yield child
            yield from visit(child)

    package = module if is_package else module.rpartition(".")[0]
    for node in visit(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield target
            for alias in node.names:  # `from . import seen` imports the module router.core.seen
                if f"{target}.{alias.name}" in MODULES:
                    yield f"{target}.{alias.name}"


def graph() -> dict[str, set[str]]:
    """Each router module and the router modules it depends on (with the packages those run first)."""
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        found: set[str] = set()
        for target in _imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            if target != "router" and not target.startswith("router."):
                continue
            parts = target.split(".")
            found.update(name for i in range(2, len(parts) + 1)
                         if (name := ".".join(parts[:i])) in MODULES
                         and (name == target or not module.startswith(name + ".")))  # (its own packages run first)
        found.discard(module)
        edges[module] = found
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def test_no_import_circle_in_the_package() -> None:
    """No two modules of router/ depend on each other, however indirectly."""
    assert cycles(graph()) == []


def test_config_does_not_import_the_core() -> None:
    """Configuration is read before the core is used: router.config imports nothing of router.core (the layout names
    it checks live in router.layout_names)."""
    assert not {m for m in graph()["router.config"] if m.startswith("router.core")}


def test_the_core_imports_no_database_client() -> None:
    """The core is I/O-free: no module of router.core imports pymongo (or motor), nor redis (live feeds' I/O is in
    router.storage.push and router.live)."""
    for module, path in MODULES.items():
        if module.startswith("router.core"):
            clients = {t for t in _imports(ast.parse(path.read_text()), module, path.name == "__init__.py")
                       if t.split(".")[0] in ("pymongo", "motor", "redis")}
            assert not clients, f"{module} imports {sorted(clients)}"


LAYOUT_MODULES = ("router.core.layouts.copies", "router.core.layouts.buckets", "router.core.layouts.outbox")


@pytest.mark.parametrize("layout", LAYOUT_MODULES)
def test_sibling_layouts_never_import_each_other(layout: str) -> None:
    """A layout uses the contract (base), the values and the neutral helpers (queries), never another layout."""
    others = set(LAYOUT_MODULES) - {layout}
    assert not graph()[layout] & others, sorted(graph()[layout] & others)
