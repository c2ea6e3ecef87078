"""The simulated run: Llama 3 405B on 10,240 H100s, as the planner lays it out.

The layout and the number of replica groups are the planner's (`plan()` with the replica
groups left to it, as `fault_tolerance: auto` asks the service), so the simulation's fast
path is one the service would accept: tests/unit/test_sim_shape_accepted.py submits this
shape to the service's dry run and gets the same groups and layout back.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from contract import ModelShape
from planner.plan import plan
from planner.presets import MODEL_PRESETS
from planner.schemas import PlannedLayout

GPUS_PER_NODE = 8  # DGX H100
HARDWARE = "h100-sxm"
# Llama 3 405B pre-training: sequence 8,192 and 16M-token batches (Llama 3 paper, 3.4.1).
SEQ_LEN = 8192
GLOBAL_BATCH_TOKENS = 16 * 2**20


@dataclass(frozen=True)
class RunShape:
    model_name: str
    model: ModelShape
    num_gpus: int
    step_s: float  # the planner's step time (with its replica groups)
    layout: PlannedLayout  # the planner's layout of the whole run
    replica_groups: int  # the planner's replica groups, the fast path's unit (1: none)
    group_nodes: int  # nodes per replica group

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // GPUS_PER_NODE

    @property
    def group_gpus(self) -> int:
        return self.group_nodes * GPUS_PER_NODE


@cache
def planned_run(
    model: str = "llama3-405b", num_gpus: int = 10_240, replica_groups: int | None = None
) -> RunShape:
    """The planner's layout and replica groups for the run (one plan() call, cached: they
    do not change with the failure rate; the reliability side is asked again per
    simulation). `replica_groups` pins their number, as a spec may (the planner then lays
    the run out for it)."""
    shape = MODEL_PRESETS[model]
    result = plan(
        shape, HARDWARE, num_gpus, SEQ_LEN, GLOBAL_BATCH_TOKENS, replica_groups=replica_groups
    )
    groups = max(1, result.fast_replica_groups)
    return RunShape(
        model_name=model,
        model=shape,
        num_gpus=num_gpus,
        step_s=result.step_time_s,
        layout=result.layout,
        replica_groups=groups,
        group_nodes=num_gpus // GPUS_PER_NODE // groups,
    )
