"""The simulated run: Llama 3 405B on 10,240 H100s, as the planner lays it out."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from contract import ModelShape
from planner.plan import plan
from planner.presets import MODEL_PRESETS

GPUS_PER_NODE = 8  # DGX H100
# Llama 3 405B pre-training: sequence 8,192 and 16M-token batches (Llama 3 paper, 3.4.1).
SEQ_LEN = 8192
GLOBAL_BATCH_TOKENS = 16 * 2**20


@dataclass(frozen=True)
class RunShape:
    model: ModelShape
    num_gpus: int
    step_s: float  # the planner's step time
    replica_groups: int  # data-parallel replicas: the fast path's unit
    group_nodes: int  # nodes per replica group (tp x cp x pp GPUs)

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // GPUS_PER_NODE

    @property
    def group_gpus(self) -> int:
        return self.group_nodes * GPUS_PER_NODE


@cache
def planned_run(model: str = "llama3-405b", num_gpus: int = 10_240) -> RunShape:
    """The planner's layout for the run (one plan() call, cached: it does not change with
    the failure rate; the reliability side is asked again per simulation)."""
    shape = MODEL_PRESETS[model]
    result = plan(shape, "h100-sxm", num_gpus, SEQ_LEN, GLOBAL_BATCH_TOKENS)
    layout = result.layout
    group_gpus = layout.tp * layout.cp * layout.pp
    return RunShape(
        model=shape,
        num_gpus=num_gpus,
        step_s=result.step_time_s,
        replica_groups=layout.dp,
        group_nodes=max(1, group_gpus // GPUS_PER_NODE),
    )
