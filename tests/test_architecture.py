"""The package's module graph: imports at module scope form no cycle.

Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so the graph has an edge
to each enclosing package of every module imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import anchordiv

ROOT = Path(anchordiv.__file__).parent

#: The one import cycle in the package today, through an import inside a function.


def _module_name(path: Path, root: Path = ROOT, package: str = "anchordiv") -> str:
    parts = (package,) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, known: set[str], deferred: bool = False) -> set[str]:
    """Modules of the package that ``path`` imports when it is imported, with the packages
    enclosing them, and with ``deferred`` also those its functions import when they run."""
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
            while target:
                if target != name and target in known:
                    found.add(target)
                target = target.rpartition(".")[0]
    return found


def _graph(deferred: bool = False, root: Path = ROOT, package: str = "anchordiv") -> dict[str, set[str]]:
    paths = {_module_name(p, root, package): p for p in root.rglob("*.py")}
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


def _chain(cycle: list[str] | None) -> str:
    return " → ".join(cycle or [])


def test_no_import_cycle_at_import_time():
    cycle = _cycle(_graph())
    assert cycle is None, _chain(cycle)


def test_no_import_cycle_through_imports_inside_functions():
    cycle = _cycle(_graph(deferred=True))
    assert cycle is None, _chain(cycle)


#: The applications: they import the library, and the library does not import them.
APPS = "anchordiv.apps"
#: Modules that may start an application: the command line, inside its command functions only.
APP_ENTRY_POINTS = {"anchordiv.cli.demo"}


def _in_apps(name: str) -> bool:
    return name == APPS or name.startswith(APPS + ".")


def test_the_library_does_not_import_the_apps():
    at_import = {name: sorted(filter(_in_apps, targets)) for name, targets in _graph().items() if not _in_apps(name)}
    assert {name: apps for name, apps in at_import.items() if apps} == {}
    deferred = _graph(deferred=True)
    anywhere = {name: sorted(filter(_in_apps, targets)) for name, targets in deferred.items()
                if not _in_apps(name) and name not in APP_ENTRY_POINTS}
    assert {name: apps for name, apps in anywhere.items() if apps} == {}
    assert "anchordiv.apps.demo" in deferred["anchordiv.cli.demo"]  # the check sees the entry point's imports


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}}) == ["a.x", "a.y", "a.z", "a.x"]
    assert _cycle({"a.x": {"a.y"}, "a.y": set()}) is None


def test_the_graph_sees_relative_imports():
    graph = _graph()
    assert "anchordiv.models.base" in graph["anchordiv.models.softmax"]
    assert "anchordiv.linalg" in graph["anchordiv.models.posterior"]
    assert "anchordiv.experiments.cli" in _graph(deferred=True)["anchordiv.cli"]


def test_the_graph_sees_enclosing_package_inits(tmp_path):
    files = {
        "__init__.py": "",
        "models/__init__.py": "from .base import Geometry\n\n\ndef registry():\n    from ..baselines import Cosine\n",
        "models/base.py": "class Geometry:\n    pass\n",
        "baselines.py": "from .models.base import Geometry\n\n\nclass Cosine(Geometry):\n    pass\n",
        "other.py": "import pkg.models.base\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = _graph(root=tmp_path, package="pkg")
    assert graph["pkg.baselines"] == {"pkg", "pkg.models", "pkg.models.base"}
    assert graph["pkg.other"] == {"pkg", "pkg.models", "pkg.models.base"}
    assert _cycle(graph) is None
    assert _cycle(_graph(deferred=True, root=tmp_path, package="pkg")) == ["pkg.baselines", "pkg.models",
                                                                           "pkg.baselines"]
