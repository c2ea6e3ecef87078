"""How a run asks for the fast path, and the refusals that name the field to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.presets import MODEL_PRESETS
from service.config import Settings
from service.runs.planning import plan_layout
from service.runs.schemas import RunSpec

BASE = {
    "name": "ft",
    "model": "tiny",
    "nodes": 2,
    "gpus_per_node": 1,
    "seq_len": 128,
    "global_batch": 8,
    "steps": 100,
    "checkpoint_every": 20,
}


def test_two_groups_on_two_nodes_split_data_parallel() -> None:
    spec = RunSpec.model_validate({**BASE, "fault_tolerance": {"replica_groups": 2}})
    assert spec.replica_groups == 2
    resolved = plan_layout(spec, MODEL_PRESETS["tiny"], Settings(accelerator="cpu"))
    assert resolved.layout.dp % 2 == 0 and resolved.plan.fast_replica_groups == 2


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"nodes": 3, "fault_tolerance": {"replica_groups": 2}}, "fault_tolerance.replica_groups"),
        ({"fault_tolerance": {"replica_groups": 2, "min_healthy_groups": 3}}, "min_healthy_groups"),
        ({"min_nodes": 1, "fault_tolerance": {"replica_groups": 2}}, "min_nodes"),
    ],
)
def test_a_spec_that_cannot_split_names_the_field(extra: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        RunSpec.model_validate({**BASE, **extra})


def test_a_pinned_tensor_parallel_degree_is_laid_out_inside_each_group() -> None:
    spec = RunSpec.model_validate(
        {
            **BASE,
            "nodes": 4,
            "gpus_per_node": 2,
            "parallelism": {"tp": 2, "pp": 2},
            "fault_tolerance": {"replica_groups": 2},
        }
    )
    resolved = plan_layout(spec, MODEL_PRESETS["tiny"], Settings(accelerator="cpu"))
    layout = resolved.layout
    assert (layout.dp, layout.tp, layout.pp) == (2, 2, 2)
    assert resolved.plan.fast_replica_groups == 2


def test_auto_under_an_entrypoint_or_min_nodes_plans_no_groups() -> None:
    for extra in ({"min_nodes": 1}, {"entrypoint": {"module": "train"}}):
        spec = RunSpec.model_validate({**BASE, **extra, "fault_tolerance": "auto"})
        assert spec.planned_replica_groups == 1
        resolved = plan_layout(spec, MODEL_PRESETS["tiny"], Settings(accelerator="cpu"))
        assert resolved.plan.fast_replica_groups == 0
