"""How close the planner's step-time model comes to published training runs.

Each case in ../shared/planner_cases.json gives a model, a cluster, a layout (parts left
out are chosen by the planner) and the throughput its source reports. We compare tokens/s
per GPU, which does not depend on how a source counts FLOPs. The model has no per-case
or per-source knob: the same hardware presets and efficiency assumptions serve every case.

    .venv/bin/python bench/planner_accuracy.py

The last line is one JSON object with the figures, the targets and "target_met".
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from contract import ModelShape  # noqa: E402
from planner.plan import plan  # noqa: E402

CASES_PATH = REPO_ROOT / ".." / "shared" / "planner_cases.json"
TARGET_MEDIAN = 0.10
TARGET_MAX = 0.25
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


def evaluate(case: dict[str, Any]) -> dict[str, Any]:
    """Plan one case with its published layout pinned; compare tokens/s per GPU."""
    layout = case["layout"]
    pinned = {pin: layout[key] for key, pin in LAYOUT_PINS.items() if key in layout}
    result = plan(
        ModelShape(**case["model"]),
        hardware=case["hardware"],
        num_gpus=case["gpus"],
        seq_len=case["seq_len"],
        global_batch_tokens=case["global_batch_tokens"],
        precision=layout.get("precision", "bf16"),
        pinned=pinned,
    )
    reported = case["reported"]["tokens_per_s_per_gpu"]
    predicted = result.tokens_per_s_per_gpu
    chosen = result.layout
    return {
        "id": case["id"],
        "predicted_tokens_per_s_per_gpu": round(predicted, 1),
        "reported_tokens_per_s_per_gpu": reported,
        "relative_error": round(predicted / reported - 1, 4),
        "predicted_mfu": round(result.mfu, 4),
        "memory_gib_per_gpu": round(result.memory_gib_per_gpu.total, 1),
        "chosen": (
            f"zero={chosen.zero_stage} mb={chosen.micro_batch_size} vp={chosen.vp} "
            f"recompute={chosen.recompute}"
        ),
    }


def main() -> None:
    cases = json.loads(CASES_PATH.read_text())["cases"]
    rows = [evaluate(case) for case in cases]
    print(f"{'case':32} {'predicted':>10} {'reported':>10} {'error':>8}  planner chose")
    for row in rows:
        print(
            f"{row['id']:32} {row['predicted_tokens_per_s_per_gpu']:>10.1f} "
            f"{row['reported_tokens_per_s_per_gpu']:>10.1f} {row['relative_error']:>+8.1%}  "
            f"{row['chosen']}"
        )
    errors = [abs(row["relative_error"]) for row in rows]
    median, worst = statistics.median(errors), max(errors)
    print(
        f"median |error| {median:.1%} (target < {TARGET_MEDIAN:.0%}); "
        f"worst {worst:.1%} (target < {TARGET_MAX:.0%})"
    )
    summary = {
        "bench": "planner_accuracy",
        "metric": "tokens/s per GPU, predicted vs reported",
        "cases": rows,
        "median_abs_error": round(median, 4),
        "max_abs_error": round(worst, 4),
        "targets": {"median_abs_error": TARGET_MEDIAN, "max_abs_error": TARGET_MAX},
        "target_met": median < TARGET_MEDIAN and worst < TARGET_MAX,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
