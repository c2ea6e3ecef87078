"""How a run asks for the fast path, and the refusals that name the field to change."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from planner.resolve import LayoutError
from service.config import Settings
from service.runs.schemas import RunSpec
from service.runs.service import plan_spec

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


def test_two_groups_on_two_nodes_split_data_parallel_and_keep_tp_pp_cp_at_one() -> None:
    spec = RunSpec.model_validate({**BASE, "fault_tolerance": {"replica_groups": 2}})
    assert spec.replica_groups == 2
    _, resolved = plan_spec(spec, Settings(accelerator="cpu"))
    layout = resolved.layout
    assert layout.dp % 2 == 0 and (layout.tp, layout.pp, layout.cp) == (1, 1, 1)


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


def test_a_pinned_tensor_parallel_degree_is_refused_naming_it() -> None:
    spec = RunSpec.model_validate(
        {
            **BASE,
            "gpus_per_node": 2,
            "parallelism": {"tp": 2},
            "fault_tolerance": {"replica_groups": 2},
        }
    )
    with pytest.raises(LayoutError) as refused:
        plan_spec(spec, Settings(accelerator="cpu"))
    assert refused.value.field == "parallelism.tp"
