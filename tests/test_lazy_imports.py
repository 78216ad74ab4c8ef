"""An import inside a function says why it is not at the top of its module.

Function-level imports hide a module's dependencies and pay a lookup at every call; one belongs inside a
function only when it breaks a cycle, must wait for something (Django's app registry, the launcher's
django.setup()), defers a heavy or optional library, or must run after the process prepared something.
Each says which, in a comment containing `lazy` on its line or on the comment line just above its group
of imports. `AppConfig.ready()` is exempt: it is where Django wants such imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "controlplane", "tenants", "billing", "dataplane", "kernels")


def _function_imports(tree: ast.AST):
    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, child)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if function is not None and function.name != "ready":
                    yield child
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            else:
                yield from visit(child, function)

    yield from visit(tree, None)


def _explained(lines: list[str], node: ast.stmt) -> bool:
    if any("lazy" in lines[i - 1].partition("#")[2] for i in range(node.lineno, node.end_lineno + 1)):
        return True
    i = node.lineno - 1  # walk up over the imports of the same group (blank lines between them) to the line above
    while i >= 1:
        above = lines[i - 1].strip()
        if above.startswith("#"):
            return "lazy" in above
        if not (above == "" or above.startswith(("import ", "from ")) or above.endswith((",", "(")) or above == ")"):
            return False
        if "#" in above and "lazy" in above.partition("#")[2]:
            return True
        i -= 1
    return False


def unexplained() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            text = path.read_text()
            lines = text.splitlines()
            for node in _function_imports(ast.parse(text)):
                if not _explained(lines, node):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_function_level_import_says_why():
    found = unexplained()
    assert not found, ("imports inside functions without a `# lazy: why` comment (move them to the top of the "
                       "module, or say which cycle, wait or heavy library keeps them here):\n  " + "\n  ".join(found))


def test_the_check_sees_an_unexplained_import(tmp_path):
    source = "def f():\n    import json\n\n    return json\n\n\ndef g():\n    # lazy: heavy\n    import json\n"
    lines = source.splitlines()
    nodes = list(_function_imports(ast.parse(source)))
    assert [_explained(lines, n) for n in nodes] == [False, True]
