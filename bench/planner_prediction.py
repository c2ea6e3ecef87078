"""The published cases the planner is scored on, and the planner's prediction for each: what
bench/planner_accuracy.py scores and bench/cp_ring_fit.py fits PyTorch's ring constant
with. A library of those two benches (each case file's format: planner_accuracy.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from contract import ModelShape  # noqa: E402
from planner import hardware as hardware_presets  # noqa: E402
from planner.attention_kernels import KERNELS  # noqa: E402
from planner.calibration import Calibration  # noqa: E402
from planner.plan import plan  # noqa: E402
from planner.schemas import PlanResult  # noqa: E402

CASE_FILES = (
    REPO_ROOT / "bench" / "planner_cases.json",
    REPO_ROOT / "bench" / "planner_cases_edges.json",
)
LAYOUT_PINS = {  # case layout key -> planner pin
    "dp": "dp",
    "tp": "tp",
    "pp": "pp",
    "cp": "cp",
    "zero_stage": "zero_stage",
    "micro_batch_size": "micro_batch_size",
    "recompute": "recompute",
    "virtual_stages": "vp",
}


def load_cases() -> list[dict[str, Any]]:
    """Every case of both files, the shared ones first."""
    return [case for path in CASE_FILES for case in json.loads(path.read_text())["cases"]]


@contextmanager
def preset_changed(hardware: str, **changes: Any) -> Iterator[None]:
    """Plan with `hardware`'s preset changed as given, then put the preset back."""
    original = hardware_presets.HARDWARE[hardware]
    hardware_presets.HARDWARE[hardware] = dataclasses.replace(original, **changes)
    try:
        yield
    finally:
        hardware_presets.HARDWARE[hardware] = original


def stack_changes(case: dict[str, Any]) -> dict[str, Any]:
    """The software a case states it ran (an input like its chip): kernel, fused loss."""
    stack = case.get("stack", {})
    changes: dict[str, Any] = {}
    if "attention_kernel" in stack:
        changes["attention_kernel"] = KERNELS[stack["attention_kernel"]]
    for flag in ("fused_loss", "selective_reruns_every_second_matmul", "cp_eager_fp32_merge"):
        if flag in stack:
            changes[flag] = bool(stack[flag])
    return changes


def predict(case: dict[str, Any], calibration: Calibration | None = None) -> tuple[float, str]:
    """(tokens/s per GPU, what the planner chose) with the case's published layout pinned."""
    result = planned(case, calibration)
    chosen = result.layout
    return result.tokens_per_s_per_gpu, (
        f"zero={chosen.zero_stage} mb={chosen.micro_batch_size} vp={chosen.vp} "
        f"recompute={chosen.recompute}"
    )


def predict_tokens_per_gpu(case: dict[str, Any]) -> float:
    """The planner's tokens/s per GPU for a case (cp_ring_fit.py's predictor)."""
    return predict(case)[0]


def planned(case: dict[str, Any], calibration: Calibration | None = None) -> PlanResult:
    """The plan of a case as its source ran it: its chip, its stack, its layout pinned."""
    layout = case["layout"]
    pinned = {pin: layout[key] for key, pin in LAYOUT_PINS.items() if key in layout}
    with preset_changed(case["hardware"], **stack_changes(case)):
        return plan(
            ModelShape(**case["model"]),
            hardware=case["hardware"],
            num_gpus=case["gpus"],
            seq_len=case["seq_len"],
            global_batch_tokens=case["global_batch_tokens"],
            precision=layout.get("precision", "bf16"),
            pinned=pinned,
            num_runners_up=0,
            calibration=calibration,
            replica_groups=1,  # as the sources ran: one group, classic recovery
        )
