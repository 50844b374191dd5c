"""The package's module graph: imports at module scope form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import anchordiv

ROOT = Path(anchordiv.__file__).parent


def _module_name(path: Path) -> str:
    parts = ("anchordiv",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str], deferred: bool = False) -> set[str]:
    """Modules of the package that ``path`` imports when it is imported, and with
    ``deferred`` also those its functions import when they run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            nodes.extend(n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
            continue
        if isinstance(node, (ast.If, ast.Try)):  # module-level guards still run at import
            nodes.extend(node.body + node.orelse + getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                nodes.extend(handler.body)
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _graph(deferred: bool = False) -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    known = set(paths)
    return {name: _imports(path, name, known, deferred) for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None. A package importing its own
    submodules (``pkg/__init__`` → ``pkg.sub``) is the normal shape, so edges from a
    submodule to its enclosing packages are not counted."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_inside_the_package():
    assert _cycle(_graph()) is None
    assert _cycle(_graph(deferred=True)) is None  # nor through imports inside functions


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None


def test_the_graph_sees_relative_imports():
    graph = _graph()
    assert "anchordiv.models.base" in graph["anchordiv.models.softmax"]
    assert "anchordiv.linalg" in graph["anchordiv.models.posterior"]
    assert "anchordiv.experiments.cli" in _graph(deferred=True)["anchordiv.cli"]
