"""Import cycles in runyard's Python packages, with the standard library's `ast` only.

Every import counts: those at a module's top, those inside functions (lazy ones) and those
under `if TYPE_CHECKING:`, as import-linter counts them. Prints

  (a) file-level cycles: each strongly connected component of more than one module, with
      its edges;
  (b) cycles among service/'s subpackages: the same over edges service.X -> service.Y
      (a module directly in service/, such as service.config, is a node of its own);
  (c) the same among the children of every other package, at every depth (import-linter's
      acyclic_siblings contract, here with bench/ and its bare-name imports too).

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


def children_graph(graph: Graph, package: str) -> dict[str, dict[str, set[str]]]:
    """The graph among `package`'s children (its subpackages and modules), each standing for
    every module under it: child X -> child Y -> the module edges that make it, for X != Y.
    The package's own __init__ is no child."""
    depth = package.count(".") + 2

    def child(module: str) -> str | None:
        if not module.startswith(package + "."):
            return None
        return ".".join(module.split(".")[:depth])

    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for source, targets in graph.items():
        source_child = child(source)
        if source_child is None:
            continue
        edges[source_child]  # every child is a node, even with no edges out
        for target in targets:
            target_child = child(target)
            if target_child is not None and target_child != source_child:
                edges[source_child][target_child].add(f"{source} -> {target}")
    return edges


def packages(graph: Graph) -> list[str]:
    """Every package: a module with modules under it."""
    return sorted({m.rsplit(".", 1)[0] for m in graph if "." in m})


def _print_components(
    edges: dict[str, dict[str, set[str]]], components: list[list[str]], indent: str = "  "
) -> None:
    for component in components:
        members = set(component)
        print(f"{indent}- {', '.join(component)}")
        for source in component:
            for target in sorted(set(edges[source]) & members):
                via = sorted(edges[source][target])
                shown = "; ".join(via[:3]) + (f"; and {len(via) - 3} more" if len(via) > 3 else "")
                print(f"{indent}    {source} -> {target}  ({shown})")


def report(graph: Graph) -> int:
    """Print the three listings; the number of cycles found."""
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

    print("(b) cycles among service/'s subpackages:")
    units = children_graph(graph, "service")
    unit_cycles = strongly_connected({u: set(targets) for u, targets in units.items()})
    _print_components(units, unit_cycles)
    if not unit_cycles:
        print("  none")

    # What import-linter's acyclic_siblings checks: a cycle between two modules of different
    # folders shows here even where (a) has none (a -> b.x, b.y -> a).
    print("(c) cycles among the children of every other package, at any depth:")
    sibling_cycles = 0
    for package in packages(graph):
        if package == "service":
            continue  # (b)
        children = children_graph(graph, package)
        cycles = strongly_connected({c: set(targets) for c, targets in children.items()})
        if cycles:
            print(f"  in {package}:")
            _print_components(children, cycles, indent="    ")
        sibling_cycles += len(cycles)
    if not sibling_cycles:
        print("  none")
    return len(file_cycles) + len(unit_cycles) + sibling_cycles


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
