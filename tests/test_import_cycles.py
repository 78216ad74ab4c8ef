"""No two modules of the project import each other, directly or through others.

The graph is read from the source with `ast`, never by importing: a node is a module
of one of PACKAGES (a package is its `__init__`), an edge is an `import` or
`from ... import` naming another project module. `from pkg import name` points at
`pkg.name` when that is a module, else at `pkg` (the name comes from its `__init__`).

Function-level (lazy) imports count as edges, the same as top-level ones. Python
tolerates a cycle closed by a lazy import, but a reader does not: the two modules
still cannot be understood or changed alone, and a lazy import is most often a
cycle hidden from the interpreter. Imports under `if TYPE_CHECKING:` count too.

Cycles are the strongly connected components of more than one module (or a module
importing itself). The test lists every one; ALLOWED holds the cycles known when the
test was written, shrinking to empty as each is untied, and an entry that no longer
exists fails the test too, so the list cannot keep a stale pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controlplane", "tenants", "billing", "dataplane", "kernels", "benchmarks")

# Cycles still being untied (each a set of module names); empty when the house is in order.
ALLOWED: list[frozenset[str]] = []


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue  # generated, and they only ever import models
            modules[_module_name(path)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The most specific project module a dotted name lives in."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                # A package's own name is its first level; a module's is its parent.
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                targets.add(target)
    return targets


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def _describe(component: frozenset[str], graph: dict[str, set[str]]) -> str:
    edges = sorted(f"{a} -> {b}" for a in component for b in graph[a] if b in component)
    return "{" + ", ".join(sorted(component)) + "}\n      " + "\n      ".join(edges)


def test_no_import_cycles_between_project_modules():
    graph = import_graph()
    found = cycles(graph)
    new = [c for c in found if c not in ALLOWED]
    assert not new, "import cycles:\n  " + "\n  ".join(_describe(c, graph) for c in new)
    stale = [sorted(c) for c in ALLOWED if c not in found]
    assert not stale, f"untied cycles still allowed in ALLOWED, remove them: {stale}"


def test_the_check_sees_a_cycle_closed_by_a_lazy_import(tmp_path):
    """The detector itself: a two-module cycle whose back edge is inside a function."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n    return x\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert graph == {"a": {"b"}, "b": {"a"}}
    assert cycles(graph) == [frozenset({"a", "b"})]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_relative_imports_resolve_from_a_package_and_from_a_module():
    modules = project_modules()
    pkg = "tenants.limits"
    assert pkg in modules
    for name in ("tenants.limits.base", "tenants.selectors"):
        assert name in modules
    # `from .base import X` in tenants/limits/__init__.py means tenants.limits.base.
    init_imports = imports_of(pkg, modules[pkg], modules)
    assert any(target.startswith("tenants.limits.") for target in init_imports)
