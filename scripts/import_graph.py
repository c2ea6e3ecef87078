"""Import cycles in runyard's Python packages, with the standard library's `ast` only.

Every import counts: those at a module's top, those inside functions (lazy ones) and those
under `if TYPE_CHECKING:`, as import-linter counts them. Prints

  (a) file-level cycles: each strongly connected component of more than one module, with
      its edges, and
  (b) cycles among service/'s subpackages: the same over edges service.X -> service.Y
      (a module directly in service/, such as service.config, is a node of its own).

    python scripts/import_graph.py           # the listing; exit 1 on any cycle
    python scripts/import_graph.py --edges service.models   # what a module or package imports

bench/ is a folder of scripts that put bench/ on sys.path: there a bare `import cp_ring_fit`
is bench.cp_ring_fit.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("service", "worker", "client", "contract", "planner", "sim", "bench")
# Folders whose scripts import their siblings by bare name (sys.path holds the folder).
SCRIPT_FOLDERS = ("bench",)

Graph = dict[str, set[str]]


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Each module's dotted name and its file (a package is its __init__.py)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names one import statement binds, each the most specific it can be.

    `import a.b` names a.b; `from a import b` names a.b when b is a module, else a (the
    caller resolves which: here both are candidates, most specific first)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        # A relative import counts from the package that holds this module.
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join([*base, node.module] if node.module else base)
    else:
        prefix = node.module or ""
    return [f"{prefix}.{alias.name}" for alias in node.names]


def _resolve(name: str, modules: dict[str, Path], folder: str | None) -> str | None:
    """The module of ours that `name` names (its nearest enclosing one), else None.

    In a script folder a name is tried as the folder's sibling first, as sys.path has it."""
    candidates = [f"{folder}.{name}", name] if folder is not None else [name]
    for candidate in candidates:
        parts = candidate.split(".")
        while parts:
            dotted = ".".join(parts)
            if dotted in modules and dotted != folder:
                return dotted
            parts.pop()
    return None


def build_graph(modules: dict[str, Path]) -> Graph:
    """module -> the modules of ours it imports, lazy and TYPE_CHECKING imports included."""
    graph: Graph = {name: set() for name in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        top = module.split(".")[0]
        folder = top if top in SCRIPT_FOLDERS else None
        for node in ast.walk(tree):  # every node: imports inside functions count too
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            relative = isinstance(node, ast.ImportFrom) and node.level > 0
            for name in _targets(node, module, path.name == "__init__.py"):
                target = _resolve(name, modules, None if relative else folder)
                if target is not None and target != module:
                    graph[module].add(target)
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted, in name order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0

    for start in sorted(graph):
        if start in index:
            continue
        # Iterative, so that a deep graph needs no recursion limit.
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def subpackage_graph(graph: Graph) -> dict[str, dict[str, set[str]]]:
    """service.X -> service.Y -> the module edges that make it, for X != Y."""

    def unit(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != "service" or len(parts) < 2:
            return None
        return ".".join(parts[:2])

    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for source, targets in graph.items():
        source_unit = unit(source)
        if source_unit is None:
            continue
        edges[source_unit]  # every subpackage is a node, even with no edges out
        for target in targets:
            target_unit = unit(target)
            if target_unit is not None and target_unit != source_unit:
                edges[source_unit][target_unit].add(f"{source} -> {target}")
    return edges


def report(graph: Graph) -> int:
    """Print both listings; the number of cycles found."""
    found = 0
    print("(a) file-level cycles (strongly connected components of more than one module):")
    file_cycles = strongly_connected(graph)
    for component in file_cycles:
        members = set(component)
        print(f"  - {', '.join(component)}")
        for source in component:
            for target in sorted(graph[source] & members):
                print(f"      {source} -> {target}")
    if not file_cycles:
        print("  none")
    found += len(file_cycles)

    print("(b) cycles among service/'s subpackages:")
    units = subpackage_graph(graph)
    unit_graph = {source: set(targets) for source, targets in units.items()}
    unit_cycles = strongly_connected(unit_graph)
    for component in unit_cycles:
        members = set(component)
        print(f"  - {', '.join(component)}")
        for source in component:
            for target in sorted(unit_graph[source] & members):
                via = sorted(units[source][target])
                shown = "; ".join(via[:3]) + (f"; and {len(via) - 3} more" if len(via) > 3 else "")
                print(f"      {source} -> {target}  ({shown})")
    if not unit_cycles:
        print("  none")
    found += len(unit_cycles)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--edges", metavar="MODULE", help="print what MODULE (and any module under it) imports"
    )
    args = parser.parse_args(argv)
    graph = build_graph(module_files())
    if args.edges:
        for source in sorted(graph):
            if source == args.edges or source.startswith(args.edges + "."):
                for target in sorted(graph[source]):
                    print(f"{source} -> {target}")
        return 0
    return 1 if report(graph) else 0


if __name__ == "__main__":
    sys.exit(main())
