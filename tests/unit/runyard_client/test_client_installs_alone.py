"""runyard-client installs alone: a team's training environment gets it without runyard's
packages or their dependencies (pydantic, tenacity, httpx, torch), on Python 3.9 or newer."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
DISTRIBUTION = REPO_ROOT / "runyard-client"
# runyard's own packages, and what they pull in: none may come with the client.
NOT_IMPORTED = {
    "service", "worker", "client", "contract", "planner",
    "pydantic", "tenacity", "httpx", "torch", "numpy", "yaml",
}  # fmt: skip

# Imports the client, runs a standalone session through it, and prints what was imported.
SESSION = """
import json, sys
from runyard_client import connect
with connect({"RUNYARD_METRICS_FILE": sys.argv[1]}) as session:
    session.report(1, 3.0, tokens=10)
    session.committed(1, sys.argv[1])
    session.finish(1)
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def run_session(python: str, tmp_path: Path, **env: str) -> set[str]:
    """Run SESSION with `python` outside the repository; the top-level modules it imported."""
    metrics = tmp_path / "metrics.jsonl"
    done = subprocess.run(
        [python, "-c", SESSION, str(metrics)],
        cwd=tmp_path,  # not the repository root: its packages must not be on the path
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
    assert kinds == ["metric", "checkpoint", "finish"]
    return set(json.loads(done.stdout))


def test_importing_runyard_client_imports_nothing_of_runyards(tmp_path: Path) -> None:
    """In runyard's own environment, where all of them are installed."""
    imported = run_session(sys.executable, tmp_path)
    assert "runyard_client" in imported
    assert not imported & NOT_IMPORTED, sorted(imported & NOT_IMPORTED)


@pytest.mark.heavy  # a fresh virtualenv and pip: 10 s, make test-all
def test_it_installs_alone_into_a_fresh_environment(tmp_path: Path) -> None:
    """A wheel built from runyard-client/, installed with no package index: had it any
    dependency, pip could not install it; then a session runs with nothing else there."""
    wheels, venv, source = tmp_path / "wheels", tmp_path / "venv", tmp_path / "runyard-client"
    # Built from a copy: setuptools leaves build/ beside its sources, and would package stale
    # files from an earlier build/ of the checkout.
    ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(DISTRIBUTION, source, ignore=ignore)

    def run(*command: str | Path) -> None:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"

    # runyard's environment has setuptools (the build backend): no index needed to build.
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "-w", wheels, source)  # fmt: skip
    [wheel] = wheels.glob("runyard_client-*.whl")
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-index", wheel)
    imported = run_session(str(venv / "bin" / "python"), tmp_path)
    assert "runyard_client" in imported and not imported & NOT_IMPORTED


def test_its_source_is_python_3_9() -> None:
    """requires-python says 3.9: no syntax of a later Python (match, `except*`, ...)."""
    sources = sorted((DISTRIBUTION / "src" / "runyard_client").glob("*.py"))
    assert len(sources) >= 5
    for source in sources:
        tree = ast.parse(source.read_text(), str(source), feature_version=(3, 9))
        # Annotations such as `int | None` are evaluated on 3.9 unless they stay strings.
        annotated = any(
            getattr(node, "annotation", None) is not None or getattr(node, "returns", None)
            for node in ast.walk(tree)
        )
        future = [
            node
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ]
        assert future or not annotated, f"{source}: from __future__ import annotations"
