"""List the longest functions of some folders, and check that none passes a limit.

    .venv/bin/python scripts/longest_functions.py worker client
    .venv/bin/python scripts/longest_functions.py --top 20 service
    .venv/bin/python scripts/longest_functions.py --max 80 worker client

A function's length runs from its `def` line to the last line of its body, docstring
included and decorators excluded, so that a decorator stack does not count against the
code it wraps. Nested functions are listed on their own and also count in the length of
the function around them, since a reader reads them there. With `--max N` the script exits
1 when any function is longer than N lines, and lists those functions.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

SKIPPED_DIRS = {".venv", "__pycache__", ".git", "node_modules", "build", "dist"}


@dataclass(frozen=True)
class FunctionLength:
    """One function: where it starts, its qualified name and its length in lines."""

    path: Path
    line: int
    name: str
    num_lines: int

    def describe(self) -> str:
        return f"{self.num_lines:5d}  {self.path}:{self.line}  {self.name}"


def python_files(folder: Path) -> list[Path]:
    """Every .py file under the folder, in a stable order, leaving tool folders out."""
    if folder.is_file():
        return [folder]
    return sorted(
        path
        for path in folder.rglob("*.py")
        if not SKIPPED_DIRS.intersection(part for part in path.relative_to(folder).parts)
    )


def functions_of(path: Path) -> list[FunctionLength]:
    """The length of every function and method in one file, nested ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[FunctionLength] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(FunctionLength(path, child.lineno, name, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def longest(folders: list[Path]) -> list[FunctionLength]:
    """All functions of the folders, longest first (ties in file order)."""
    functions = [
        fn for folder in folders for path in python_files(folder) for fn in functions_of(path)
    ]
    return sorted(functions, key=lambda fn: (-fn.num_lines, str(fn.path), fn.line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="folders (or files) to measure")
    parser.add_argument("-n", "--top", type=int, default=10, help="how many to list (default 10)")
    parser.add_argument(
        "--max", type=int, default=None, help="exit 1 when a function is longer than this"
    )
    args = parser.parse_args(argv)

    functions = longest(args.folders)
    for fn in functions[: args.top]:
        print(fn.describe())
    if args.max is None:
        return 0
    too_long = [fn for fn in functions if fn.num_lines > args.max]
    if not too_long:
        print(f"no function is longer than {args.max} lines")
        return 0
    print(f"\n{len(too_long)} function(s) longer than {args.max} lines:", file=sys.stderr)
    for fn in too_long:
        print(fn.describe(), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
