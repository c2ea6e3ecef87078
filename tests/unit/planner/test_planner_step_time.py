"""The step-time model's structure: bubble, FLOP convention, and what each choice costs."""

from __future__ import annotations

import pytest

from contract import ModelShape
from planner.collectives import Fabric
from planner.hardware import HARDWARE, Network
from planner.layout import Layout
from planner.presets import MODEL_PRESETS
from planner.step_time import StepTime, estimate_step
from planner.transformer import matmul_params, model_flops_per_token

H100 = HARDWARE["h100-sxm"]
FABRIC = Fabric.of(H100, Network.IB, 8)
LLAMA3_70B = MODEL_PRESETS["llama3-70b"]


def step(model: ModelShape = LLAMA3_70B, grad_accum: int = 8, **overrides: object) -> StepTime:
    values: dict[str, object] = dict(
        dp=1,
        tp=8,
        pp=4,
        cp=1,
        zero_stage=1,
        micro_batch_size=1,
        recompute="none",
        precision="bf16",
        vp=1,
    )
    values.update(overrides)
    layout = Layout(**values)  # type: ignore[arg-type]
    return estimate_step(model, H100, FABRIC, layout, 8192, grad_accum)


def test_mfu_convention_is_6n_plus_12_l_h_s() -> None:
    model = MODEL_PRESETS["llama3-8b"]
    n = matmul_params(model)
    assert n == model.num_params - model.vocab * model.hidden - (2 * model.layers + 1) * 4096
    assert model_flops_per_token(model, 8192) == 6 * n + 12 * 32 * 4096 * 8192


def test_bubble_is_pp_minus_one_over_micro_batches() -> None:
    s = step(grad_accum=8)
    per_micro_batch = (s.compute_s + s.tp_comm_s + s.cp_comm_s) / 8
    assert s.bubble_s == pytest.approx(3 * per_micro_batch)


def test_interleaving_divides_the_bubble_by_virtual_stages() -> None:
    plain, interleaved = step(vp=1), step(vp=5)
    assert interleaved.bubble_s == pytest.approx(plain.bubble_s / 5)


def test_fp8_is_faster_but_not_twice_as_fast() -> None:
    bf16, fp8 = step(), step(precision="fp8")
    ratio = bf16.total_s / fp8.total_s
    assert 1.1 < ratio < 2.0


def test_recompute_costs_time_in_order() -> None:
    times = [step(recompute=r).total_s for r in ("none", "selective", "full")]
    assert times == sorted(times)
    assert times[2] / times[0] == pytest.approx(4 / 3, rel=0.1)  # one more forward


def test_tensor_parallel_traffic_is_zero_without_tensor_parallel() -> None:
    s = step(model=MODEL_PRESETS["llama3-8b"], tp=1, pp=1, dp=8)
    assert s.tp_comm_s == 0 and s.bubble_s == 0


def test_collectives_use_nvlink_inside_a_node_and_nics_across() -> None:
    inside = FABRIC.collective_s(1e9, size=8, stride=1, passes=1)
    across = FABRIC.collective_s(1e9, size=8, stride=8, passes=1)
    # An all-gather moves (n - 1) / n of the buffer through each GPU's link, plus a hop
    # latency per ring step (7 on NVLink; 7 between nodes, as NCCL's all-gather is a ring).
    assert inside == pytest.approx(7 / 8 * 1e9 / FABRIC.nvlink_bytes_per_s + 7 * 5e-6)
    assert across == pytest.approx(7 / 8 * 1e9 / FABRIC.nic_bytes_per_s + 7 * 15e-6)
    # An all-reduce between nodes runs as a tree: log2(8) = 3 steps each way.
    reduce = FABRIC.collective_s(1e9, size=8, stride=8, passes=2)
    assert reduce == pytest.approx(2 * 7 / 8 * 1e9 / FABRIC.nic_bytes_per_s + 2 * 3 * 15e-6)
    assert FABRIC.nvlink_bytes_per_s == pytest.approx(900e9 / 2 * 0.8)  # 360 GB/s
    assert FABRIC.nic_bytes_per_s == pytest.approx(400e9 / 8 * 0.8)  # 40 GB/s
