"""GPU MFU: the worker's own training step on Llama 3 8B's layer shape, one GPU.

As many 8B layers as fit the GPU's memory (with the 8B's vocabulary, embeddings and output
head), trained by worker.step.train_step (the step the training loop runs) with
torch.compile per block, in BF16 and, where the GPU has FP8 tensor cores and torchao is
installed, in FP8 (worker/parallel/float8.py). MFU is quoted in planner.schemas
MFU_CONVENTION against the dense BF16 peak of planner.hardware (also for FP8). The timed
steps run under torch.cuda.set_sync_debug_mode, which warns at every host sync in them (the
step should make none): each is counted and printed with the Python stack that made it, and
any other warning in the timed steps is printed too (a count that matched the word
"synchroniz" in any warning once took one for a sync). Target: 50% BF16 MFU on an
H100/H200-class GPU.

    .venv/bin/python bench/gpu_mfu.py                  # on a GPU node (skips without CUDA)
    .venv/bin/python bench/gpu_mfu.py --device cpu --shape small --layers 1   # the logic
    .venv/bin/python bench/gpu_mfu.py --smoke   # the same, 2 timed steps: seconds
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract import ModelShape, WorkerRunConfig
from planner.hardware import HARDWARE, Hardware
from planner.presets import MODEL_PRESETS
from planner.schemas import MFU_CONVENTION
from planner.transformer import layer_params, model_flops_per_token
from worker.cross_group import CrossGroupSync
from worker.data import TokenBatches, open_corpus
from worker.distributed import init_distributed, shutdown_distributed
from worker.errors import UnsupportedLayoutError
from worker.launch import read_launch_env
from worker.parallel import ParallelDims, build_training_model
from worker.parallel.float8 import check_fp8_hardware
from worker.step import build_optimizer, next_token_loss, train_step

TARGET_MFU_BF16 = 0.50  # issue 4: half the dense BF16 peak on an H100/H200-class GPU
SHAPES = {
    "llama3-8b": MODEL_PRESETS["llama3-8b"],  # the layer shape; the layer count is ours
    "small": ModelShape(layers=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256),
}
# Memory of our step on one GPU (no ZeRO), per parameter: FP32 weight, FP32 gradient and
# AdamW's two FP32 moments (16), plus the BF16 copy autocast keeps from forward to backward.
BYTES_PER_PARAM = 4 + 4 + 8 + 2
# Per token and vocabulary entry: BF16 logits, their FP32 copy for the loss, its gradient.
LOGIT_BYTES = 2 + 4 + 4
FIXED_BYTES = 3 * 2**30  # CUDA context, cuBLAS workspaces, compiled kernels (~1-2 GiB each)
HEADROOM = 0.10  # caching-allocator fragmentation, typically 5-15% of reserved memory
# What torch.cuda.set_sync_debug_mode("warn") says at a sync (c10/cuda/CUDAFunctions.cpp).
SYNC_WARNING = "called a synchronizing CUDA operation"
REPO = str(Path(__file__).resolve().parents[1])


def activation_bytes_per_token(shape: ModelShape) -> float:
    """What one token leaves stored in one of our blocks for backward, BF16 autocast, no
    recompute (counted from worker/model.py): the FP32 residual stream's two RMSNorms keep
    their FP32 input and output (16h); the Q/K/V, output and MLP GEMMs their BF16 inputs
    (3 x 2h + 2h + 2 x 2h); attention Q, the repeated K and V and its output (4 x 2h); the
    SwiGLU gate, its SiLU, the up projection and their product (4 x 2f)."""
    h, f = shape.hidden, shape.ffn
    return 16 * h + 12 * h + 8 * h + 8 * f


def per_layer_bytes(shape: ModelShape, tokens: int) -> float:
    return layer_params(shape) * BYTES_PER_PARAM + activation_bytes_per_token(shape) * tokens


def memory_estimate(shape: ModelShape, tokens: int) -> float:
    """Peak bytes of our step on one device for `shape` (all its layers), `tokens` a step."""
    embeddings = 2 * shape.vocab * shape.hidden * BYTES_PER_PARAM  # input table, output head
    base = embeddings + LOGIT_BYTES * tokens * shape.vocab + FIXED_BYTES
    return base + shape.layers * per_layer_bytes(shape, tokens)


def layers_that_fit(shape: ModelShape, tokens: int, capacity_bytes: float) -> int:
    """How many of `shape`'s layers one device of `capacity_bytes` trains, with HEADROOM
    to spare (0: not even one)."""
    none = memory_estimate(shape.model_copy(update={"layers": 0}), tokens)
    room = capacity_bytes * (1 - HEADROOM) - none
    return max(0, int(room // per_layer_bytes(shape, tokens)))


def hardware_of(device: torch.device) -> Hardware | None:
    """The planner's preset for this GPU, by name (None on a CPU or an unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).upper()
    if "PCIE" in name:  # PCIe cards run at lower clocks than the SXM presets' peaks
        return None
    for key, preset in (("H200", "h200"), ("H100", "h100-sxm"), ("A100", "a100-80gb")):
        if key in name:
            return HARDWARE[preset]
    return None


@dataclass
class Result:
    precision: str
    layers: int
    step_s: float
    tokens_per_s: float
    model_tflops: float  # model FLOP/s in the MFU convention, / 1e12
    mfu: float | None
    host_syncs: int | None  # in the timed steps (None: not countable on a CPU)
    peak_memory_gib: float | None
    estimated_memory_gib: float
    sync_sites: dict[str, int] = field(default_factory=dict)  # where each sync was made
    other_warnings: list[str] = field(default_factory=list)  # in the timed steps


def config_for(shape: ModelShape, precision: str, args: argparse.Namespace) -> WorkerRunConfig:
    layout = {"dp": 1, "micro_batch_size": args.micro_batch, "precision": precision}
    return WorkerRunConfig(
        run_id=0,
        attempt_id=0,
        attempt_number=1,
        name="gpu-mfu",
        model=shape,
        layout=layout | {"compile": args.compile},  # type: ignore[arg-type]
        seq_len=args.seq_len,
        global_batch=args.micro_batch,
        steps=args.warmup + args.steps,
        lr=1e-4,
        warmup_steps=1,
        checkpoint_every=10**6,
        checkpoint_dir=str(args.tmp / "ckpt"),
        data_cache_dir=str(args.tmp / "data"),
    )


@dataclass
class Syncs:
    """The host syncs and other warnings seen in a block of steps."""

    sites: list[str] = field(default_factory=list)  # one per sync: its innermost frames
    other: list[str] = field(default_factory=list)


def _site(stack: traceback.StackSummary) -> str:
    """A sync's place: the innermost frame of this repository, then the innermost of all."""
    ours = [f for f in stack if f.filename.startswith(REPO) and not f.filename.endswith(__file__)]
    place = [*ours[-1:], stack[-1]] if ours else list(stack[-2:])
    return " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(place))


def count_syncs(device: torch.device) -> Any:
    """A context that records the host syncs CUDA makes in it, each with the stack that made
    it, and every other warning (nothing to count on a CPU)."""
    if device.type != "cuda":
        return contextlib.nullcontext(Syncs())

    @contextlib.contextmanager
    def recording() -> Any:
        seen = Syncs()

        def show(message: Any, category: Any, filename: str, lineno: int, *_: Any) -> None:
            # Called where the warning is raised, so the stack is the sync's own.
            if SYNC_WARNING in str(message):
                seen.sites.append(_site(traceback.extract_stack()[:-1]))
            else:
                seen.other.append(f"{category.__name__}: {message} ({filename}:{lineno})")

        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = show
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield seen
            finally:
                torch.cuda.set_sync_debug_mode("default")

    return recording()


def measure(
    shape: ModelShape, precision: str, args: argparse.Namespace, device: torch.device
) -> Result:
    """Warm up (compiles), then time args.steps steps of train_step."""
    config = config_for(shape, precision, args)
    dims = ParallelDims.from_layout(config.layout, 1)
    dims.build_mesh(device.type)
    model = build_training_model(config, dims, device, next_token_loss)
    optimizers = [build_optimizer(part, config) for part in model.parts]
    batches = TokenBatches(
        open_corpus("builtin", args.tmp / "data"), config.seq_len, config.global_batch, 1
    )

    sync = CrossGroupSync()  # one group: nothing across groups

    def run(step: int) -> torch.Tensor:
        stepped = train_step(
            model, optimizers, batches, step, config.lr, config, dims, device, sync
        )
        assert stepped is not None  # one group never votes a step down
        return stepped[0]

    for step in range(1, args.warmup + 1):
        run(step)
    if device.type == "cuda":
        torch.cuda.synchronize()  # sync: the timed steps start on an idle GPU
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    with count_syncs(device) as syncs:
        losses = [run(step) for step in range(args.warmup + 1, args.warmup + args.steps + 1)]
    if device.type == "cuda":
        torch.cuda.synchronize()  # sync: the timed steps have finished on the GPU
    step_s = (time.perf_counter() - start) / args.steps
    assert torch.isfinite(torch.stack(losses)).all(), "the loss went non-finite"
    tokens_per_s = config.global_batch * config.seq_len / step_s
    flops = model_flops_per_token(shape, config.seq_len) * tokens_per_s
    hardware = hardware_of(device)
    tokens = config.global_batch * config.seq_len
    return Result(
        precision=precision,
        layers=shape.layers,
        step_s=step_s,
        tokens_per_s=tokens_per_s,
        model_tflops=flops / 1e12,
        mfu=flops / hardware.peak_bf16_flops if hardware else None,  # BF16 peak, FP8 too
        host_syncs=len(syncs.sites) if device.type == "cuda" else None,
        peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else None,
        estimated_memory_gib=memory_estimate(shape, tokens) / 2**30,
        sync_sites=dict(Counter(syncs.sites)),
        other_warnings=sorted(set(syncs.other)),
    )


def flop_check(shape: ModelShape, args: argparse.Namespace, device: torch.device) -> float:
    """Matrix-product FLOPs torch counts in one eager step, over what the MFU convention
    charges for its tokens: 1.0 when the convention's 6N + 12 x layers x hidden x seq
    describes the step (attention runs on the math path here, which computes every score,
    as the convention counts them)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    config = config_for(shape, "bf16", argparse.Namespace(**{**vars(args), "compile": False}))
    dims = ParallelDims.from_layout(config.layout, 1)
    dims.build_mesh(device.type)
    model = build_training_model(config, dims, device, next_token_loss)
    optimizers = [build_optimizer(part, config) for part in model.parts]
    batches = TokenBatches(open_corpus("builtin", args.tmp / "data"), config.seq_len, 1, 1)
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        train_step(model, optimizers, batches, 1, config.lr, config, dims, device, CrossGroupSync())
    tokens = config.global_batch * config.seq_len
    return counter.get_total_flops() / (model_flops_per_token(shape, config.seq_len) * tokens)


def device_capacity_bytes(device: torch.device) -> float:
    """Memory free for training now: the GPU's, or this machine's available RAM."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def measure_fitting(
    shape: ModelShape, precision: str, args: argparse.Namespace, device: torch.device
) -> Result:
    """measure(), with fewer layers after an out-of-memory when the count was estimated."""
    for attempt in range(3):
        try:
            return measure(shape, precision, args, device)
        except torch.OutOfMemoryError:
            if args.layers or attempt == 2:
                raise
            fewer = shape.layers - max(1, shape.layers // 10)
            print(f"  {precision}: out of memory at {shape.layers} layers, trying {fewer}")
            shape = shape.model_copy(update={"layers": fewer})
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    raise AssertionError("unreachable")


def report(out: dict[str, Any], target_met: bool) -> None:
    print(json.dumps(out | {"target_mfu_bf16": TARGET_MFU_BF16, "target_met": target_met}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda (cpu: --smoke)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    parser.add_argument("--layers", type=int, help="default: as many as fit the device")
    parser.add_argument("--seq-len", type=int, help="default: 8192 (Llama 3), 64 for small")
    parser.add_argument("--micro-batch", type=int, default=1, help="sequences per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (compile)")
    parser.add_argument("--precisions", default="bf16,fp8", help="fp8 only where supported")
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="default: on a GPU only"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="--shape small --layers 1 --steps 2 --warmup 1, on the CPU unless --device cuda: "
        "every step in seconds, no figure",
    )
    args = parser.parse_args()
    if args.smoke:
        args.device = args.device or "cpu"
        args.shape, args.layers, args.steps, args.warmup = "small", 1, 2, 1
    args.device = args.device or "cuda"
    out: dict[str, Any] = {
        "bench": "gpu_mfu",
        "smoke": args.smoke,
        "shape": args.shape,
        "mfu_convention": MFU_CONVENTION,
    }
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped (run it on a GPU node; --device cpu checks the logic)")
        report(out | {"skipped": "no CUDA device"}, target_met=False)
        return 0
    args.seq_len = args.seq_len or (8192 if args.shape == "llama3-8b" else 64)
    args.compile = args.device == "cuda" if args.compile is None else args.compile
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tokens = args.seq_len * args.micro_batch
    capacity = device_capacity_bytes(device)
    fit = layers_that_fit(SHAPES[args.shape], tokens, capacity)
    layers = args.layers or fit
    hardware = hardware_of(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"{name} ({hardware.name if hardware else 'no peak known'}): {capacity / 2**30:.0f} GiB "
        f"free, fits {fit} {args.shape} layers at {tokens} tokens a step; running {layers}"
    )
    if layers < 1:
        print(f"not even one {args.shape} layer fits: nothing to measure")
        report(out | {"skipped": "no layer fits", "device": name}, target_met=False)
        return 0
    shape = SHAPES[args.shape].model_copy(update={"layers": layers})
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    init_distributed(read_launch_env({}), device)
    try:
        with tempfile.TemporaryDirectory(prefix="runyard-mfu-") as tmp:
            args.tmp = Path(tmp)
            for precision in args.precisions.split(","):
                if precision == "fp8":
                    try:
                        check_fp8_hardware()
                    except UnsupportedLayoutError as exc:
                        skipped["fp8"] = str(exc)
                        print(f"fp8: skipped: {exc}")
                        continue
                result = measure_fitting(shape, precision, args, device)
                results[precision] = vars(result)
                mfu = f"{result.mfu:.1%}" if result.mfu is not None else "n/a (no peak)"
                peak = f"{result.peak_memory_gib:.1f}" if result.peak_memory_gib else "n/a"
                print(
                    f"{precision}: {result.layers} layers, {result.step_s * 1e3:.0f} ms/step, "
                    f"{result.tokens_per_s:,.0f} tokens/s, {result.model_tflops:.1f} model "
                    f"TFLOP/s, MFU {mfu}; host syncs in timed steps: {result.host_syncs}; "
                    f"peak memory {peak} GiB (estimated {result.estimated_memory_gib:.1f})",
                    flush=True,
                )
                for site, count in result.sync_sites.items():
                    print(f"  host sync x{count}: {site}", flush=True)
                for warning in result.other_warnings:
                    print(f"  other warning in the timed steps: {warning}", flush=True)
            if device.type == "cpu":
                ratio = flop_check(shape, args, device)
                out["flops_counted_over_convention"] = round(ratio, 4)
                print(f"FLOP accounting: torch counts {ratio:.4f} x the convention's FLOPs")
    finally:
        shutdown_distributed()
    bf16 = results.get("bf16", {}).get("mfu")
    out |= {
        "device": name,
        "hardware": hardware.name if hardware else None,
        "seq_len": args.seq_len,
        "tokens_per_step": tokens,
        "layers_that_fit": fit,
        "compile": args.compile,
        "results": results,
        "skipped_precisions": skipped,
    }
    if hardware is None:
        out["note"] = f"no dense BF16 peak known for {name}: MFU not computed"
    report(out, target_met=bf16 is not None and bf16 >= TARGET_MFU_BF16)
    return 0


if __name__ == "__main__":
    sys.exit(main())
