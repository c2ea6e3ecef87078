"""`make lint` keeps dependencies pointing one way (client -> HTTP -> service -> contract <-
worker): it passes on the tree as it is and fails when the service imports the worker or the
CLI imports the service. Run on a copy of the packages, so the checkout is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "worker", "client", "contract", "planner")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            REPO_ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO_ROOT / "pyproject.toml", tree)
    return tree


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def with_import(pristine: Path, tmp_path: Path, module: str, line: str) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree)
    path = tree / module
    path.write_text(f"{line}  # noqa\n{path.read_text()}")
    return tree


def test_the_tree_as_it_is_keeps_every_contract(pristine: Path) -> None:
    result = lint(pristine)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_service_importing_the_worker_breaks_the_lint(pristine: Path, tmp_path: Path) -> None:
    tree = with_import(pristine, tmp_path, "service/runs/service.py", "import worker.model")
    result = lint(tree)
    assert result.returncode != 0
    assert "the service never imports the worker (torch) or the CLI BROKEN" in result.stdout


def test_the_cli_importing_the_service_breaks_the_lint(pristine: Path, tmp_path: Path) -> None:
    tree = with_import(
        pristine, tmp_path, "client/commands/run.py", "from service.config import Settings"
    )
    result = lint(tree)
    assert result.returncode != 0
    assert "the CLI talks to the service over HTTP, never by importing it BROKEN" in result.stdout
