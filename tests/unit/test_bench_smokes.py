"""Every bench runs (issue 43): each bench's `--smoke`, as a developer
runs it, exits 0 and ends with one JSON object that says whether it met its target.

A smoke is the bench's own code path at its smallest size, in seconds; it may miss its
target (target_met false), never crash. The benches that need the dev cluster, sudo or a
Slurm (recovery, devcluster_scale, control_plane, owner_gate, slurm_hostlists,
slurm_output_forms) smoke their pure parts: argument parsing, their figures and verdict on
made-up or recorded inputs, the JSON line; none of them touches the dev cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH = REPO_ROOT / "bench"
SMOKE_TIMEOUT_S = 120  # each takes seconds alone; the machine may be busy with other tests
MAIN_GUARD = 'if __name__ == "__main__":'


def benches() -> list[Path]:
    """bench/*.py that run as programs. The others are libraries of a bench, run by it."""
    return sorted(path for path in BENCH.glob("*.py") if MAIN_GUARD in path.read_text())


def libraries() -> list[Path]:
    return sorted(set(BENCH.glob("*.py")) - set(benches()))


@pytest.mark.parametrize("bench", benches(), ids=lambda path: path.stem)
def test_the_benchs_smoke_runs_and_ends_with_its_figures(bench: Path) -> None:
    # Without the tests' settings (conftest.py points RUNYARD_* at the test database).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(bench), "--smoke"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=SMOKE_TIMEOUT_S,
    )
    took_s = time.monotonic() - started
    print(f"{bench.name} --smoke: {took_s:.1f} s")
    assert done.returncode == 0, (
        f"{bench.name} --smoke exited {done.returncode} (every bench has a --smoke that "
        f"runs in seconds):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"{bench.name} --smoke printed nothing"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"{bench.name} --smoke's last line is not JSON: {lines[-1][:500]!r}")
    assert isinstance(result, dict), f"{bench.name}: the last line is not a JSON object"
    assert isinstance(result.get("target_met"), bool), (
        f"{bench.name}: the last line has no true/false target_met: {sorted(result)}"
    )


@pytest.mark.parametrize("library", libraries(), ids=lambda path: path.stem)
def test_a_benchs_library_is_run_by_a_bench(library: Path) -> None:
    users = [b.name for b in benches() if f"bench.{library.stem} import" in b.read_text()]
    assert users, (
        f"bench/{library.name} has no `__main__` and no bench imports it: give it a "
        "--smoke of its own, or have a bench's smoke run it"
    )
