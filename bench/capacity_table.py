"""The capacity table of docs/design.md: Llama 3 1B, 8B, 70B and 405B on 8 to 10,240 H100s.

Every cell is a real `plan()` call (BF16, InfiniBand, sequence 8,192). The global batch
grows with the cluster as large runs do: one sequence per GPU, at least 1M and at most 16M
tokens (Llama 3 405B's final batch). Regenerate the table with:

    .venv/bin/python bench/capacity_table.py | head -n -1 > /tmp/capacity.md
    .venv/bin/python bench/capacity_table.py --smoke   # 405B's row only

The last line (left out above) is one JSON object with the count of cells planned and
"target_met": every model plans on 10,240 GPUs (the largest cluster in scope), and every cell
that does not fit says on how many GPUs it would.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from planner.plan import PlanError, plan  # noqa: E402
from planner.presets import MODEL_PRESETS  # noqa: E402

MODELS = ("llama3-1b", "llama3-8b", "llama3-70b", "llama3-405b")
GPU_COUNTS = (8, 512, 2048, 10_240)
SEQ_LEN = 8192
MIN_BATCH_TOKENS, MAX_BATCH_TOKENS = 2**20, 16 * 2**20
COLUMNS = (
    "model",
    "GPUs",
    "batch (tokens)",
    "layout (dp/tp/pp/cp/vp, zero, mb, recompute)",
    "GiB/GPU",
    "step s",
    "tokens/s",
    "MFU",
    "MTBI h",
    "ckpt every",
    "goodput",
    "spares",
)


def batch_tokens(num_gpus: int) -> int:
    """One sequence per GPU, clamped to the 1M..16M tokens large runs use."""
    return min(MAX_BATCH_TOKENS, max(MIN_BATCH_TOKENS, num_gpus * SEQ_LEN))


def row(model: str, num_gpus: int) -> tuple[list[str], str]:
    """One table row (the plan's headline figures, or why there is none) and its outcome:
    "planned", "advised" (does not fit, and says where it would) or "refused"."""
    batch = batch_tokens(num_gpus)
    head = [model, f"{num_gpus:,}", f"{batch / 2**20:.0f}M"]
    try:
        result = plan(MODEL_PRESETS[model], "h100-sxm", num_gpus, SEQ_LEN, batch)
    except PlanError as exc:
        fits = f"; fits on {exc.advice[0]}" if exc.advice else ""
        return [*head, f"does not fit{fits}", *[""] * 8], "advised" if exc.advice else "refused"
    lay = result.layout
    layout = (
        f"{lay.dp}/{lay.tp}/{lay.pp}/{lay.cp}/{lay.vp}, z{lay.zero_stage}, "
        f"mb{lay.micro_batch_size}, {lay.recompute}"
    )
    ckpt = result.checkpoint
    cells = [
        *head,
        layout,
        f"{result.memory_gib_per_gpu.total:.0f}",
        f"{result.step_time_s:.2f}",
        f"{result.tokens_per_s:,.0f}",
        f"{result.mfu:.1%}",
        f"{result.mtbi_h:,.1f}",
        f"{ckpt.interval_steps} steps ({ckpt.interval_s / 60:.0f} min)",
        f"{result.goodput:.1%}",
        str(result.spare_nodes),
    ]
    return cells, "planned"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="Llama 3 405B's row only")
    args = parser.parse_args()
    models = MODELS[-1:] if args.smoke else MODELS
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join(" --- " for _ in COLUMNS) + "|")
    outcomes: dict[str, dict[int, str]] = {}
    for model in models:
        for num_gpus in GPU_COUNTS:
            cells, outcome = row(model, num_gpus)
            outcomes.setdefault(model, {})[num_gpus] = outcome
            print("| " + " | ".join(cells) + " |")
    largest = max(GPU_COUNTS)
    met = all(o[largest] == "planned" for o in outcomes.values()) and all(
        outcome != "refused" for o in outcomes.values() for outcome in o.values()
    )
    summary = {
        "bench": "capacity_table",
        "smoke": args.smoke,
        "cells": outcomes,
        "planned": sum(outcome == "planned" for o in outcomes.values() for outcome in o.values()),
        "targets": {
            "plans_on_gpus": largest,
            "a cell that does not fit": "says on how many GPUs it would",
        },
        "target_met": met,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
