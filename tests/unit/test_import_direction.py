"""`make lint` keeps dependencies pointing one way (client -> HTTP -> service -> contract <-
worker) and without cycles, service's subpackages in layers: it passes on the tree as it is
and fails when the service imports the worker, the CLI imports the service, a lazy import
closes a cycle or a lower layer imports a higher one. Run on a copy of the packages, so the
checkout is never touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("service", "worker", "client", "contract", "planner", "sim", "bench", "scripts")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CYCLES = "no import cycles: no module imports itself back, at any depth"
LAYERS = "service's subpackages form layers (docs/architecture.md)"


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


def import_graph(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(tree / "scripts" / "import_graph.py")],
        cwd=tree,
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


def with_lazy_import(pristine: Path, tmp_path: Path, module: str, line: str) -> Path:
    """The import inside a function at the module's end: run only when it is called."""
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree)
    path = tree / module
    path.write_text(f"{path.read_text()}\n\ndef _later() -> None:\n    {line}  # noqa\n")
    return tree


def test_the_tree_as_it_is_keeps_every_contract(pristine: Path) -> None:
    result = lint(pristine)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    graph = import_graph(pristine)
    assert graph.returncode == 0, graph.stdout + graph.stderr


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


def test_a_lazy_import_that_closes_a_cycle_breaks_the_lint(pristine: Path, tmp_path: Path) -> None:
    """The models import nothing of the service's; the reconciler imports the models."""
    tree = with_lazy_import(
        pristine, tmp_path, "service/models/run.py", "from service.reconcile import loop"
    )
    result = lint(tree)
    assert result.returncode != 0
    assert f"{CYCLES} BROKEN" in result.stdout
    assert f"{LAYERS} BROKEN" in result.stdout
    assert "service.models.run -> service.reconcile.loop" in result.stdout
    graph = import_graph(tree)
    assert graph.returncode == 1
    assert "service.models.run -> service.reconcile.loop" in graph.stdout


def test_an_upward_import_breaks_the_layers(pristine: Path, tmp_path: Path) -> None:
    """No cycle (nothing imports the settings' doc generator), but a lower layer imports a
    higher one: the layers contract alone catches it."""
    tree = with_import(pristine, tmp_path, "service/config_doc.py", "import service.integrations")
    result = lint(tree)
    assert result.returncode != 0
    assert f"{CYCLES} KEPT" in result.stdout
    assert f"{LAYERS} BROKEN" in result.stdout
    assert "service.config_doc is not allowed to import service.integrations" in result.stdout


def test_a_cycle_between_two_benches_fails_the_import_graph(pristine: Path, tmp_path: Path) -> None:
    """bench/ is a folder of scripts, which import their siblings by bare name: import-linter
    does not see it, scripts/import_graph.py does."""
    tree = with_lazy_import(
        pristine, tmp_path, "bench/planner_prediction.py", "import planner_accuracy"
    )
    graph = import_graph(tree)
    assert graph.returncode == 1
    assert "bench.planner_accuracy -> bench.planner_prediction" in graph.stdout
