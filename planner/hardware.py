"""Accelerator and network presets, each number with the public document it comes from.

The planner's models are only as good as these figures, so every one names its source.
Rates are stored in SI units (FLOP/s, bytes/s, bytes); GiB only appears at the edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .attention_kernels import FA2_AMPERE, FA2_HOPPER, AttentionKernel

GIB = 2**30
GBPS = 1e9 / 8  # one gigabit per second, in bytes per second


class Network(StrEnum):
    """The scale-out fabric between nodes."""

    IB = "ib"  # InfiniBand, one NIC per GPU (rail-optimised)
    EFA = "efa"  # AWS Elastic Fabric Adapter, a per-node aggregate


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator model and the links around it."""

    name: str
    peak_bf16_flops: float  # dense, no sparsity
    peak_fp8_flops: float | None  # None: no FP8 tensor cores
    hbm_bytes: float  # what the driver reports as total memory
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # per GPU, both directions together (vendor convention)
    ib_bytes_per_s_per_gpu: float
    efa_bytes_per_s_per_node: float
    num_sms: int  # streaming multiprocessors: one GEMM output tile each per wave
    gemm_efficiency: float  # achievable fraction of peak for large BF16 GEMMs (see below)
    # The fused attention kernel the worker runs here, with its published speed curve;
    # `attention.py` applies it per call (keys, head dim, causal).
    attention_kernel: AttentionKernel
    # The loss the worker runs: PyTorch's cross-entropy keeps an FP32 copy of the logits
    # for backward; a fused kernel (flash-attn's xentropy, llm-foundry's default) keeps
    # only the BF16 logits and writes their gradient in place (`memory.py`).
    fused_loss: bool = False
    # What "selective" recompute reruns. Megatron's (Korthikanti et al. 2022) reruns the
    # cheap elementwise ops only; torchtitan's selective op checkpointing also reruns
    # every second matmul of a block (its policy saves aten.mm outputs "except every
    # second mm"; torchtitan parallelize_llama.py, the version behind docs/performance.md).
    selective_reruns_every_second_matmul: bool = False
    # Context parallel's merges: Transformer Engine's fused kernels, or PyTorch's own
    # context parallel in eager FP32 ops (`attention.py`).
    cp_eager_fp32_merge: bool = False

    def peak_flops(self, precision: str) -> float:
        """Dense peak of the math the linear layers run in."""
        if precision == "fp8":
            if self.peak_fp8_flops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores; use --precision bf16")
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def nic_bytes_per_s_per_gpu(self, network: Network, gpus_per_node: int) -> float:
        """Scale-out bandwidth one GPU can use when all GPUs of its node send at once."""
        if network is Network.EFA:
            return self.efa_bytes_per_s_per_node / gpus_per_node
        return self.ib_bytes_per_s_per_gpu


HARDWARE: dict[str, Hardware] = {
    "h100-sxm": Hardware(
        name="h100-sxm",
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOP/s and FP8
        # 3,958 TFLOP/s "with sparsity"; dense is half of each.
        peak_bf16_flops=989.4e12,
        peak_fp8_flops=1978.9e12,
        # 80 GB HBM3 (datasheet); nvidia-smi reports 81,559 MiB total on H100 80GB HBM3.
        hbm_bytes=81_559 * 2**20,
        hbm_bytes_per_s=3.35e12,  # datasheet: 3.35 TB/s
        nvlink_bytes_per_s=900e9,  # datasheet: NVLink 4, 900 GB/s per GPU
        # DGX H100 user guide: eight ConnectX-7 NDR 400 Gb/s compute NICs, one per GPU.
        ib_bytes_per_s_per_gpu=400 * GBPS,
        efa_bytes_per_s_per_node=3200 * GBPS,  # AWS p5.48xlarge: 3,200 Gbps EFAv2
        num_sms=132,  # NVIDIA H100 architecture whitepaper: 132 SMs on H100 SXM5
        # An 8192^3 BF16 matmul ran at 769-798 TFLOP/s (0.78-0.81 of peak) over ten
        # back-to-back products on the GH100 chip measured in this workplace (device
        # KINDS.md; H200 has the H100 SXM's compute). The same product on zeros ran 13 %
        # faster: the chip is power-bound, not arithmetic-bound. A node training for hours
        # sits at its 700 W limit with NVLink, HBM and NICs also drawing, so the clock
        # settles ~15-20 % lower still: 0.79 x 0.82 ~ 0.65 sustained.
        gemm_efficiency=0.65,
        # FlashAttention-2: what PyTorch's SDPA runs on Hopper (attention_kernels.py).
        # No power derating: FA2 leaves the tensor cores two-thirds idle (softmax and
        # synchronisation bound; FA3 paper: FA2 "achieving only 35% utilization on the
        # H100"), so the chip does not reach its power limit the way dense GEMMs do.
        attention_kernel=FA2_HOPPER,
    ),
    "h100-sxm-96gb-500w": Hardware(
        # Meta's Grand Teton hosts, where torchtitan's docs/performance.md was measured:
        # "Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory
        # bandwidth", "400 Gb/s per GPU", "the default 500W power limit". The same GH100
        # chip (132 SMs, the SXM tensor-core rates) as h100-sxm.
        name="h100-sxm-96gb-500w",
        peak_bf16_flops=989.4e12,
        peak_fp8_flops=1978.9e12,
        # Six 16 GiB stacks, less the same ECC/driver reserve as the 80 GB part
        # (81,920 - 81,559 MiB).
        hbm_bytes=(98_304 - 361) * 2**20,
        hbm_bytes_per_s=2.4e12,
        nvlink_bytes_per_s=900e9,
        ib_bytes_per_s_per_gpu=400 * GBPS,
        efa_bytes_per_s_per_node=3200 * GBPS,
        num_sms=132,
        # h100-sxm's 0.65 is GEMMs held at the 700 W limit. Dynamic power goes as C V^2 f
        # and V rises with f across the DVFS range, so power ~ f^3 and a 500 W limit
        # leaves (500 / 700)^(1/3) = 0.89 of the clock: 0.65 x 0.89 ~ 0.58.
        gemm_efficiency=round(0.65 * (500 / 700) ** (1 / 3), 2),
        # FA2 via SDPA, not power-bound (see h100-sxm); torchtitan's loss is PyTorch's.
        attention_kernel=FA2_HOPPER,
    ),
    "h200": Hardware(
        name="h200",
        # NVIDIA H200 datasheet (SXM): same tensor-core rates as H100 SXM.
        peak_bf16_flops=989.4e12,
        peak_fp8_flops=1978.9e12,
        hbm_bytes=143_771 * 2**20,  # 141 GB HBM3e; nvidia-smi reports 143,771 MiB
        hbm_bytes_per_s=4.8e12,  # datasheet: 4.8 TB/s
        nvlink_bytes_per_s=900e9,  # datasheet: NVLink 900 GB/s
        ib_bytes_per_s_per_gpu=400 * GBPS,  # DGX H200: ConnectX-7 400 Gb/s per GPU
        efa_bytes_per_s_per_node=3200 * GBPS,  # AWS p5e.48xlarge: 3,200 Gbps EFA
        num_sms=132,  # same GH100 configuration as H100 SXM
        gemm_efficiency=0.65,  # same chip and power limit as H100 SXM (see above)
        attention_kernel=FA2_HOPPER,  # same chip and kernel as H100 SXM
    ),
    "a100-80gb": Hardware(
        name="a100-80gb",
        # NVIDIA A100 datasheet (SXM 80GB): BF16 312 TFLOP/s dense; no FP8.
        peak_bf16_flops=312e12,
        peak_fp8_flops=None,
        hbm_bytes=81_920 * 2**20,  # 80 GB HBM2e; nvidia-smi reports 81,920 MiB
        hbm_bytes_per_s=2.039e12,  # datasheet: 2,039 GB/s
        nvlink_bytes_per_s=600e9,  # datasheet: NVLink 3, 600 GB/s per GPU
        # DGX A100 user guide: eight ConnectX-6 HDR 200 Gb/s compute NICs, one per GPU.
        ib_bytes_per_s_per_gpu=200 * GBPS,
        efa_bytes_per_s_per_node=400 * GBPS,  # AWS p4d.24xlarge: 400 Gbps EFA
        num_sms=108,  # NVIDIA A100 architecture whitepaper: 108 SMs
        # cuBLAS BF16 GEMMs burst to ~80 % of 312; at its 400 W limit A100 throttles less
        # than H100. Narayanan et al. 2021 (Megatron-LM, SC21, Table 1) sustain 52 % of
        # peak end to end on 3,072 GPUs after ~20 % of bubble and communication, which
        # puts the layers' own GEMMs near 0.52 / 0.77 ~ 0.68.
        gemm_efficiency=0.68,
        attention_kernel=FA2_AMPERE,  # FlashAttention-2 via SDPA (attention_kernels.py)
    ),
}

# NCCL reaches about 80 % of a link's one-way rate as bus bandwidth in nccl-tests
# (DGX H100 all-reduce ~360 GB/s on NVLink 4 = 450 GB/s one way; DGX A100 ~230 GB/s of
# 300); we use the same share for the NICs.
NVLINK_EFFICIENCY = 0.8
NIC_EFFICIENCY = 0.8
# Per-step latency of one hop of a ring collective; NCCL's own tuning model uses a few
# microseconds inside a node and ~10-20 us over IB/EFA.
NVLINK_HOP_LATENCY_S = 5e-6
NIC_HOP_LATENCY_S = 15e-6
# STREAM-style copies reach ~85-90 % of HBM datasheet bandwidth (4.3 TB/s counting read and
# write on the H200 here, of 4.8); memory-bound kernels in training do a little worse.
HBM_EFFICIENCY = 0.8


def hardware_named(name: str) -> Hardware:
    """The preset called `name`, or a ValueError listing the ones that exist."""
    try:
        return HARDWARE[name]
    except KeyError:
        known = ", ".join(sorted(HARDWARE))
        raise ValueError(f"unknown hardware {name!r}; known: {known}") from None
