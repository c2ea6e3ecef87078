"""The capacity table of docs/design.md: Llama 3 1B, 8B, 70B and 405B on 8 to 10,240 H100s.

Every cell is a real `plan()` call (BF16, InfiniBand, sequence 8,192). The global batch
grows with the cluster as large runs do: one sequence per GPU, at least 1M and at most 16M
tokens (Llama 3 405B's final batch). Regenerate the table with:

    .venv/bin/python bench/capacity_table.py > /tmp/capacity.md
"""

from __future__ import annotations

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


def row(model: str, num_gpus: int) -> list[str]:
    """One table row: the plan's headline figures, or why there is none."""
    batch = batch_tokens(num_gpus)
    head = [model, f"{num_gpus:,}", f"{batch / 2**20:.0f}M"]
    try:
        result = plan(MODEL_PRESETS[model], "h100-sxm", num_gpus, SEQ_LEN, batch)
    except PlanError as exc:
        fits = f"; fits on {exc.advice[0]}" if exc.advice else ""
        return [*head, f"does not fit{fits}", *[""] * 8]
    lay = result.layout
    layout = (
        f"{lay.dp}/{lay.tp}/{lay.pp}/{lay.cp}/{lay.vp}, z{lay.zero_stage}, "
        f"mb{lay.micro_batch_size}, {lay.recompute}"
    )
    ckpt = result.checkpoint
    return [
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


def main() -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join(" --- " for _ in COLUMNS) + "|")
    for model in MODELS:
        for num_gpus in GPU_COUNTS:
            print("| " + " | ".join(row(model, num_gpus)) + " |")


if __name__ == "__main__":
    main()
