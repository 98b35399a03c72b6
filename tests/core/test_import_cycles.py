"""No import cycles in nsq_sansio/ or transports/: a module's imports point one way, down.

Every import counts, wherever it is written: at the top, inside a function (a lazy import only
hides a cycle until that function runs) or under ``if TYPE_CHECKING:`` (a reader still has to
know both modules to read either). An import names the module it reaches: ``from . import x``
where ``x`` is a submodule is an edge to ``x``, ``from .pkg import name`` an edge to ``pkg``
(its ``__init__``), and a package's parents are not edges (Python imports them first, but they
do not import back unless their ``__init__`` says so, and then that is an edge of its own).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import nsq_sansio
import transports

ROOTS = (Path(nsq_sansio.__file__).parent, Path(transports.__file__).parent)


def _module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of the two packages by dotted name."""
    found: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            found[_module_name(root, path)] = path
    return found


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The known modules that module ``name`` (at ``path``) imports."""
    known = set(known)
    is_package = path.name == "__init__.py"
    edges: set[str] = set()

    def reach(module: str) -> None:
        # ``import a.b.c`` of a name that is not a module: its longest known prefix.
        while module and module not in known:
            module = module.rpartition(".")[0]
        if module and module != name:
            edges.add(module)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                reach(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                if submodule in known:
                    reach(submodule)
                else:
                    reach(module)
    return edges


def components(graph: Mapping[str, Iterable[str]]) -> list[set[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm): each
    module in one can reach every other, so each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle per strongly connected component, as ``[a, b, ..., a]``, sorted."""
    return sorted(_path_through(graph, component) for component in components(graph))


def _path_through(graph: Mapping[str, Iterable[str]], component: set[str]) -> list[str]:
    """One concrete cycle inside a strongly connected component, from its first module."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.get(node, ())):
                if target == start:
                    return [*paths[node], start]
                if target in component and target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, found) for name, path in found.items()}


def test_no_import_cycles() -> None:
    graph = import_graph()
    report = [
        " -> ".join(_path_through(graph, c)) + f"  (all of: {', '.join(sorted(c))})"
        for c in components(graph)
    ]
    assert report == [], "import cycles:\n" + "\n".join(report)


def test_cycle_finder_reports_a_cycle_and_ignores_a_diamond() -> None:
    graph = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set(), "x": {"y"}, "y": {"z"}}
    assert cycles(graph) == []
    graph["z"] = {"x"}
    assert cycles(graph) == [["x", "y", "z", "x"]]


def test_relative_imports_resolve_to_submodules_not_the_package(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from . import sibling\n"
        "from .pkg import thing\n"
        "from .. import top\n"
        "def lazy():\n"
        "    import root.other.deep_name\n"
    )
    known = {"root", "root.top", "root.sub", "root.sub.sibling", "root.sub.pkg", "root.other"}
    assert imports_of("root.sub.mod", source, known) == {
        "root.sub.sibling",
        "root.sub.pkg",
        "root.top",
        "root.other",
    }
