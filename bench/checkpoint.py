"""Checkpoint bench: how long an asynchronous save holds training up, against a synchronous
save of the same state; and how fast checkpoints reach the disk, against the disk itself.

The state is what the worker saves (worker.checkpoint.training_state: weights, AdamW's two
moments, counters, RNG) of a model of ~50M parameters, ~0.6 GB; the saves are the
worker's own (checkpoint.save, and AsyncCheckpointer as the training loop uses it) in a
one-process gloo group. The disk's sequential write speed is measured in the same run, on
the same folder, with the same fsync at the end that DCP's writer does. Repetitions
alternate the order of the two saves. Target: the asynchronous save blocks training for
under 10% of the synchronous save's time (median over repetitions).

    .venv/bin/python bench/checkpoint.py [--reps 5] [--dir FOLDER]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract import ModelShape, WorkerRunConfig
from worker import checkpoint
from worker.distributed import init_distributed, read_launch_env, shutdown_distributed
from worker.model import build_model
from worker.step import build_optimizer

TARGET_BLOCKING_RATIO = 0.10  # issue 4: async save blocks training < 10% of a sync save
# 8 blocks of width 768: 50M parameters, x3 with AdamW's moments = 0.6 GB of fp32 state,
# large enough that writing it takes seconds here, small enough for a 24 GiB machine.
MODEL = ModelShape(layers=8, hidden=768, heads=12, kv_heads=4, ffn=2048, vocab=256)
CHUNK_BYTES = 64 * 2**20  # sequential writes in 64 MiB blocks


def disk_write_bytes_per_s(folder: Path, num_bytes: int) -> float:
    """Sequential write speed of `folder`'s disk: `num_bytes` of random data (nothing to
    compress or deduplicate) in large blocks, then fsync, as DCP's writer ends each file."""
    block = os.urandom(CHUNK_BYTES)
    path = folder / "sequential.bin"
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        written = 0
        while written < num_bytes:
            written += f.write(block[: min(CHUNK_BYTES, num_bytes - written)])
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    path.unlink()
    return num_bytes / elapsed


def training_state(root: Path) -> dict[str, checkpoint.Stateful]:
    """The worker's checkpoint state of MODEL after one optimizer step (moments allocated)."""
    config = WorkerRunConfig(
        run_id=0,
        attempt_id=0,
        attempt_number=1,
        name="checkpoint-bench",
        model=MODEL,
        layout={"dp": 1, "micro_batch_size": 1},  # type: ignore[arg-type]
        seq_len=64,
        global_batch=1,
        steps=1,
        lr=1e-4,
        checkpoint_every=1,
        checkpoint_dir=str(root),
        data_cache_dir=str(root),
    )
    model = build_model(MODEL, config.seed, torch.device("cpu"), config.seq_len)
    optimizer = build_optimizer(model, config)
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    optimizer.step()  # creates exp_avg and exp_avg_sq for every parameter
    optimizer.zero_grad(set_to_none=True)
    trainer = checkpoint.TrainerState(step=1, data_step=1, consumed_tokens=64)
    return checkpoint.training_state([model], [optimizer], trainer, rank=0)


def state_bytes(state: dict[str, checkpoint.Stateful]) -> int:
    tensors = [
        value
        for stateful in state.values()
        for value in stateful.state_dict().values()
        if isinstance(value, torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each measurement")
    parser.add_argument("--dir", type=Path, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    init_distributed(read_launch_env({}), torch.device("cpu"))
    root = Path(tempfile.mkdtemp(prefix="runyard-ckpt-bench-", dir=args.dir))
    write_s: dict[str, list[float]] = {"sync": [], "async": []}
    disk_bps: dict[str, list[float]] = {"sync": [], "async": []}
    blocking_s: list[float] = []
    try:
        state = training_state(root)
        print(f"state: {state_bytes(state) / 2**30:.2f} GiB of tensors", flush=True)
        async_saver = checkpoint.AsyncCheckpointer(root / "async", state)
        # Warm-up, not counted: the first save of each kind plans it, starts its threads and
        # (async) allocates the host copy that later saves reuse.
        size = checkpoint.save(root / "sync", 0, state).num_bytes
        async_saver.save(0)
        async_saver.wait()
        for rep in range(1, args.reps + 1):
            for kind in ("sync", "async") if rep % 2 else ("async", "sync"):
                # The disk right before each save: its speed drifts with the neighbours' I/O.
                disk_bps[kind].append(disk_write_bytes_per_s(root, size))
                if kind == "sync":
                    saved = checkpoint.save(root / "sync", rep, state)
                    write_s[kind].append(saved.write_s)
                else:
                    start = time.perf_counter()
                    async_saver.save(rep)  # what the training loop waits for
                    blocking_s.append(time.perf_counter() - start)
                    done = async_saver.wait()
                    assert done is not None and checkpoint.is_committed(done.path)
                    write_s[kind].append(done.write_s)
            print(
                f"rep {rep}/{args.reps}: sync save {write_s['sync'][-1]:.2f} s "
                f"(disk {disk_bps['sync'][-1] / 1e6:.0f} MB/s just before); async save "
                f"blocks {blocking_s[-1]:.3f} s, written in {write_s['async'][-1]:.2f} s "
                f"(disk {disk_bps['async'][-1] / 1e6:.0f} MB/s just before)",
                flush=True,
            )
            for old in (root / "sync", root / "async"):  # keep one copy of each on disk
                for folder in sorted(old.glob("step_*"))[:-1]:
                    shutil.rmtree(folder)
    finally:
        shutdown_distributed()
        shutil.rmtree(root, ignore_errors=True)

    sync_median, blocking_median = statistics.median(write_s["sync"]), statistics.median(blocking_s)
    ratio = blocking_median / sync_median
    # Each save's throughput against the disk's speed measured just before it.
    vs_disk = {
        kind: statistics.median(
            size / seconds / disk
            for seconds, disk in zip(write_s[kind], disk_bps[kind], strict=True)
        )
        for kind in ("sync", "async")
    }
    disk = statistics.median(disk_bps["sync"] + disk_bps["async"])
    print(
        f"checkpoint {size / 1e9:.2f} GB: sync save {sync_median:.2f} s, async save blocks "
        f"training {blocking_median:.3f} s = {ratio:.1%} of it (target < "
        f"{TARGET_BLOCKING_RATIO:.0%}); written at {vs_disk['sync']:.0%} (sync) and "
        f"{vs_disk['async']:.0%} (async) of the disk's sequential speed ({disk / 1e6:.0f} MB/s)"
    )
    print(
        json.dumps(
            {
                "bench": "checkpoint",
                "model": MODEL.model_dump(),
                "checkpoint_bytes": size,
                "reps": args.reps,
                "sync_save_s_median": round(sync_median, 4),
                "async_blocking_s_median": round(blocking_median, 4),
                "async_write_s_median": round(statistics.median(write_s["async"]), 4),
                "blocking_ratio": round(ratio, 4),
                "disk_sequential_bytes_per_s_median": round(disk),
                "sync_write_vs_disk": round(vs_disk["sync"], 3),
                "async_write_vs_disk": round(vs_disk["async"], 3),
                "target_blocking_ratio": TARGET_BLOCKING_RATIO,
                "target_met": ratio < TARGET_BLOCKING_RATIO,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
