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
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in MODULES]
            if len(submodules) < len(node.names):  # names the package itself defines or re-exports
                yield target
            yield from submodules  # `from . import seen` imports the module router.core.notify.seen


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


#: The core's concerns, each a subpackage of router.core, in the order they may depend on each other: a concern
#: imports only the kernel (the core's top-level modules named in KERNEL) and the concerns before it. ``settings``
#: and ``calls`` are top-level modules with a place of their own in that order.
KERNEL = ("router.core.steps", "router.core.policy", "router.core.nogc", "router.core.pseudonyms", "router.core.push")
CONCERNS = ("layouts", "periods", "writes", "reads", "fanout", "social", "settings", "notify", "privacy", "calls",
            "live")


def concern_of(module: str) -> str | None:
    """The concern *module* belongs to ("kernel" for the kernel, None outside router.core or for the core itself)."""
    if module in KERNEL:
        return "kernel"
    parts = module.split(".")
    return parts[2] if parts[:2] == ["router", "core"] and len(parts) > 2 else None


def test_the_core_is_grouped_by_concern() -> None:
    """Every module of router.core is the kernel or belongs to a named concern: a new module finds its place."""
    assert {c for m in MODULES if (c := concern_of(m)) is not None} == {"kernel", *CONCERNS}


def test_concerns_depend_one_way() -> None:
    """A concern imports the kernel and the concerns before it in CONCERNS, never one after it; the kernel imports no
    concern."""
    rank = {"kernel": -1, **{c: i for i, c in enumerate(CONCERNS)}}
    wrong = sorted(f"{m} -> {t}" for m, targets in graph().items() if (c := concern_of(m)) is not None
                   for t in targets if (d := concern_of(t)) is not None and c != d and rank[d] >= rank[c])
    assert wrong == []


def _package_names(concern: str) -> set[str]:
    """What router.core.<concern>'s __init__ offers others: its ``__all__``."""
    tree = ast.parse((ROUTER / "core" / concern / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_other_modules_use_a_concern_through_its_package() -> None:
    """No module outside a concern reaches into its modules: it imports the package's ``__all__`` only (the modules a
    concern keeps to itself can change without touching anyone else)."""
    packages = {c for c in CONCERNS if (ROUTER / "core" / c / "__init__.py").exists()}
    wrong = []
    for module, path in MODULES.items():
        is_package = path.name == "__init__.py"
        package = module if is_package else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.split(".")
            target = (".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                      if node.level else node.module or "")
            parts = target.split(".")
            if parts[:2] != ["router", "core"] or len(parts) < 3 or parts[2] not in packages:
                continue
            if module.split(".")[:3] == parts[:3]:
                continue  # inside the concern
            if len(parts) > 3:
                wrong.append(f"{module}: from {target}")
            else:
                wrong += [f"{module}: {target}.{a.name}" for a in node.names if a.name not in _package_names(parts[2])]
    assert wrong == []


def test_each_concern_says_what_it_owns_and_may_import() -> None:
    """Each concern's package opens with a docstring naming what it owns and what it may import."""
    for concern in CONCERNS:
        init = ROUTER / "core" / concern / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert "May import" in doc or "may import" in doc, concern
