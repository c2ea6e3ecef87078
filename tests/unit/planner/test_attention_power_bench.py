"""bench/attention_power.py's logic on a CPU, so its one run on a GPU node (issue 18's power
question) does not die on a bug: every shape in both directions, each next to the planner's
speed for it, and the JSON line a reader parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "attention_power.py"


@pytest.mark.heavy  # every ring shape timed: 6 s, make test-all (its smoke: make test)
def test_the_bench_measures_every_ring_shape_against_the_planner() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--seq", "64", "--seconds", "0.01",
         "--hardware", "h100-sxm"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    shapes = {(c["queries"], c["keys"], c["causal"], c["direction"]) for c in result["calls"]}
    assert shapes == {
        (q, k, causal, d)
        for q, k, causal in ((64, 64, True), (64, 32, False), (32, 64, False))
        for d in ("forward", "backward")
    }
    for call in result["calls"]:
        assert call["tflops"] > 0 and call["planner_tflops"] > 0
        assert call["error"] == call["tflops"] / call["planner_tflops"] - 1
    assert result["attention_peak_watts"] is None  # no NVML on a CPU: no made-up power
    assert result["target_met"] is False  # a CPU is nowhere near the planner's H100 speeds
