"""Attention on one GPU: SDPA's flash kernel against the planner's curve, and its power.

The planner charges attention at the published curve of the kernel a run uses
(planner/attention_kernels.py: PyTorch's SDPA flash build for runyard's worker and
torchtitan) and, unlike GEMMs, no power derating: FlashAttention-2 leaves the tensor cores
mostly idle, so the argument goes, and does not reach the chip's power limit. Issue 18's
open rows ran under a 500 W limit, where that argument may fail. This bench measures both
on the GPU it runs on, with the shapes of those rows (one sequence, 32 heads of 128):

- the diagonal ring step, a causal call over 32K keys, and the two off-diagonal shapes of
  load-balanced context parallel (32K queries x 16K keys, 16K queries x 32K keys),
  forward and backward, each against the planner's speed for it (`kernel_efficiency`);
- the board power and SM clock NVML reports while each runs, next to a dense 8192^3 BF16
  matmul's (the GEMMs' derating is measured that way, planner/hardware.py), and the clock
  a 500 W limit would leave the attention, (500 / P)^(1/3) with power ~ f^3 (the same
  DVFS model as the GEMMs'; 1.0 when P <= 500 W).

Target: every measured call within 15% of the planner's curve. It reads the power limit,
never sets it.

    .venv/bin/python bench/attention_power.py               # on a GPU node (skips without CUDA)
    .venv/bin/python bench/attention_power.py --device cpu --seq 512 --seconds 0.2 \
        --hardware h100-sxm                                   # the logic (CPU speeds)
    .venv/bin/python bench/attention_power.py --smoke   # the same at 64 queries: seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_mfu import hardware_of
from planner.attention import ATTENTION_BACKWARD_RATIO, kernel_efficiency
from planner.attention_kernels import KERNELS
from planner.hardware import HARDWARE, Hardware

TARGET_MAX_ERROR = 0.15  # measured TFLOP/s against the planner's, each call
HEADS, HEAD_DIM = 32, 128  # Llama 3.1 8B after torchtitan's repeat_kv
CAPPED_WATTS = 500.0  # Grand Teton's default limit (torchtitan docs/performance.md)
GEMM_SIZE = 8192
SAMPLE_S = 0.05


@dataclass
class Call:
    """One attention shape in one direction, measured and as the planner sees it."""

    name: str
    direction: str  # "forward" or "backward"
    queries: int
    keys: int
    causal: bool
    ms: float
    tflops: float
    planner_tflops: float | None
    watts: float | None
    sm_mhz: float | None

    @property
    def error(self) -> float | None:
        return None if self.planner_tflops is None else self.tflops / self.planner_tflops - 1


class PowerSampler:
    """NVML's board power (W) and SM clock (MHz), sampled on a thread while a loop runs."""

    def __init__(self, device: torch.device) -> None:
        self.handle: Any = None
        if device.type == "cuda":
            import pynvml

            pynvml.nvmlInit()
            self.nvml: Any = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def limit_watts(self) -> float | None:
        if self.handle is None:
            return None
        return float(self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle)) / 1000

    def __enter__(self) -> PowerSampler:
        self.samples = []
        self._stop.clear()
        if self.handle is not None:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self) -> None:
        nvml, handle = self.nvml, self.handle
        while not self._stop.wait(SAMPLE_S):
            watts = nvml.nvmlDeviceGetPowerUsage(handle) / 1000
            mhz = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            self.samples.append((float(watts), float(mhz)))

    def means(self) -> tuple[float | None, float | None]:
        if not self.samples:
            return None, None
        steady = self.samples[len(self.samples) // 4 :] or self.samples  # past the ramp
        return statistics.fmean(w for w, _ in steady), statistics.fmean(m for _, m in steady)


def timed(fn: Callable[[], object], seconds: float, device: torch.device) -> float:
    """Seconds per call of `fn`, run back to back for about `seconds` after a warm-up."""
    for _ in range(2):
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    once = max(time.perf_counter() - start, 1e-6)
    repeats = max(3, int(seconds / once))
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention_flops(queries: int, keys: int, causal: bool) -> float:
    """Forward FLOPs that do work (QK^T and PV; half the scores when causal), the convention
    of planner.transformer.attention_forward_flops."""
    return 4.0 * queries * keys * HEADS * HEAD_DIM * (0.5 if causal else 1.0)


def measure_call(
    name: str,
    queries: int,
    keys: int,
    causal: bool,
    args: argparse.Namespace,
    device: torch.device,
    hardware: Hardware | None,
    sampler: PowerSampler,
) -> list[Call]:
    """Forward and backward of one SDPA call of this shape, in BF16 (FP32 on a CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def tensor(length: int) -> torch.Tensor:
        return torch.randn(1, HEADS, length, HEAD_DIM, device=device, dtype=dtype)

    q, k, v = (tensor(n).requires_grad_() for n in (queries, keys, keys))
    grad = tensor(queries)
    backends = [torch.nn.attention.SDPBackend.FLASH_ATTENTION]
    if device.type == "cpu":
        backends = [torch.nn.attention.SDPBackend.MATH]

    def forward() -> torch.Tensor:
        with torch.nn.attention.sdpa_kernel(backends):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def forward_and_backward() -> None:
        out = forward()
        torch.autograd.grad(out, (q, k, v), grad)

    flops = attention_flops(queries, keys, causal)
    calls = []
    with torch.no_grad(), sampler:
        forward_s = timed(forward, args.seconds, device)
    forward_power = sampler.means()
    with sampler:
        both_s = timed(forward_and_backward, args.seconds, device)
    backward_power = sampler.means()
    backward_s = max(both_s - forward_s, 1e-9)
    planner_tflops: tuple[float, float] | None = None  # forward, backward
    if hardware is not None:
        sdpa = replace(hardware, attention_kernel=KERNELS["pytorch-sdpa-flash"])  # what runs
        efficiency = kernel_efficiency(sdpa, keys, HEAD_DIM, causal)
        planner_tflops = (
            efficiency[0] * hardware.peak_bf16_flops / 1e12,
            efficiency[1] * hardware.peak_bf16_flops / 1e12,
        )
    for direction, seconds, work, (watts, mhz), index in (
        ("forward", forward_s, flops, forward_power, 0),
        ("backward", backward_s, ATTENTION_BACKWARD_RATIO * flops, backward_power, 1),
    ):
        calls.append(
            Call(
                name,
                direction,
                queries,
                keys,
                causal,
                ms=seconds * 1e3,
                tflops=work / seconds / 1e12,
                planner_tflops=None if planner_tflops is None else planner_tflops[index],
                watts=watts,
                sm_mhz=mhz,
            )
        )
    return calls


def measure_gemm(
    args: argparse.Namespace, device: torch.device, sampler: PowerSampler
) -> dict[str, Any]:
    """A dense BF16 matmul's speed, power and clock: the GEMM side of the comparison."""
    size = GEMM_SIZE if device.type == "cuda" else args.seq
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    with sampler:
        seconds = timed(lambda: a @ b, args.seconds, device)
    watts, mhz = sampler.means()
    return {"size": size, "tflops": 2.0 * size**3 / seconds / 1e12, "watts": watts, "sm_mhz": mhz}


def capped_clock(watts: float | None) -> float | None:
    """The share of its clock a call drawing `watts` keeps under a 500 W limit (power ~ f^3)."""
    if watts is None:
        return None
    return min(1.0, (CAPPED_WATTS / watts) ** (1 / 3))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), help="default: cuda (cpu: --smoke)")
    parser.add_argument("--seq", type=int, default=32768, help="local queries (32K: the rows)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed per call")
    parser.add_argument(
        "--hardware", choices=sorted(HARDWARE), help="the planner preset (default: by GPU name)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="--seq 64 --seconds 0.01, on the CPU unless --device cuda, against h100-sxm's "
        "curve on a CPU: every step in seconds, no figure",
    )
    args = parser.parse_args()
    if args.smoke:
        args.device = args.device or "cpu"
        args.seq, args.seconds = 64, 0.01
        if args.device == "cpu":
            args.hardware = args.hardware or "h100-sxm"
    args.device = args.device or "cuda"
    out: dict[str, Any] = {
        "bench": "attention_power",
        "smoke": args.smoke,
        "target_max_error": TARGET_MAX_ERROR,
    }
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped (run it on a GPU node; --device cpu checks the logic)")
        print(json.dumps(out | {"skipped": "no CUDA device", "target_met": False}))
        return 0
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    hardware = HARDWARE[args.hardware] if args.hardware else hardware_of(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    sampler = PowerSampler(device)
    limit = sampler.limit_watts()
    limit_text = f"{limit:.0f} W" if limit is not None else "unknown"
    print(f"{name} ({hardware.name if hardware else 'no preset'}), power limit {limit_text}")
    seq, half = args.seq, args.seq // 2
    shapes = (
        ("diagonal (causal)", seq, seq, True),
        ("off-diagonal, all queries", seq, half, False),
        ("off-diagonal, half the queries", half, seq, False),
    )
    calls: list[Call] = []
    for label, queries, keys, causal in shapes:
        for call in measure_call(label, queries, keys, causal, args, device, hardware, sampler):
            calls.append(call)
            planner = (
                f"planner {call.planner_tflops:.0f} ({call.error:+.0%})"
                if call.planner_tflops is not None
                else "no planner preset"
            )
            power = (
                f", {call.watts:.0f} W at {call.sm_mhz:.0f} MHz" if call.watts is not None else ""
            )
            print(
                f"{label:31} {call.direction:8} {queries:>6} x {keys:<6} "
                f"{call.ms:9.2f} ms {call.tflops:7.1f} TFLOP/s, {planner}{power}",
                flush=True,
            )
    gemm = measure_gemm(args, device, sampler)
    gemm_power = f", {gemm['watts']:.0f} W at {gemm['sm_mhz']:.0f} MHz" if gemm["watts"] else ""
    print(f"dense {gemm['size']}^3 matmul: {gemm['tflops']:.1f} TFLOP/s{gemm_power}")
    attention_watts = [c.watts for c in calls if c.watts is not None]
    peak_watts = max(attention_watts) if attention_watts else None
    clock_at_500 = capped_clock(peak_watts)
    if clock_at_500 is not None:
        print(
            f"attention draws up to {peak_watts:.0f} W: a {CAPPED_WATTS:.0f} W limit would "
            f"leave it {clock_at_500:.2f} of its clock (power ~ f^3)"
        )
    errors = [abs(c.error) for c in calls if c.error is not None]
    out |= {
        "device": name,
        "hardware": hardware.name if hardware else None,
        "power_limit_w": limit,
        "calls": [asdict(c) | {"error": c.error} for c in calls],
        "gemm": gemm,
        "attention_peak_watts": peak_watts,
        "attention_clock_at_500w": clock_at_500,
        "max_error": max(errors) if errors else None,
    }
    print(json.dumps(out | {"target_met": bool(errors) and max(errors) <= TARGET_MAX_ERROR}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
