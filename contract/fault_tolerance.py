"""Replica groups: what a rank of a fault-tolerant run needs to know about its group.

A fault-tolerant run is `groups` complete copies of the model (replica groups), each its
own Slurm job, stepping together through torchft's quorum: the lighthouse at
`lighthouse_addr` admits the live groups each step, so a group that loses a node drops out
while the others go on, and its replacement heals from a live peer (docs/design.md, "Fast
recovery"). The run's data-parallel degree spans the groups: each group trains
`layout.dp // groups` of it, with every other degree of the layout (tp, pp, cp, ZeRO)
inside the group, and the survivors train the missing groups' share of the global batch,
so a step's batch is the same whoever is alive.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from ._frozen import Frozen
from .layout import LayoutDegrees, ParallelLayout


class ReplicaGroupConfig(Frozen):
    """This attempt's replica group and how to reach the others."""

    group: int = Field(ge=0, description="This group's index, 0 .. groups - 1.")
    groups: int = Field(ge=2, description="Replica groups in the run (complete model copies).")
    min_healthy_groups: int = Field(
        default=1, ge=1, description="Groups that must step for a step to commit."
    )
    lighthouse_addr: str = Field(description="torchft lighthouse, http://host:port.")
    heal_from_peer: bool = Field(
        default=False,
        description="This group replaces a failed one: it must heal from a live peer, and "
        "exits rather than train alone from scratch when none is left.",
    )
    timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Cross-group collective and quorum timeout: how long survivors wait on "
        "a dead group before stepping without it.",
    )

    @model_validator(mode="after")
    def _group_in_range(self) -> ReplicaGroupConfig:
        if self.group >= self.groups:
            raise ValueError(f"group {self.group} is not below groups ({self.groups})")
        if self.min_healthy_groups > self.groups:
            raise ValueError(
                f"min_healthy_groups ({self.min_healthy_groups}) exceeds groups ({self.groups})"
            )
        return self


def replica_layout_problems(
    layout: LayoutDegrees, groups: int, num_nodes: int | None = None
) -> list[tuple[str, str]]:
    """(field, message) for each reason `layout` on `num_nodes` nodes (None: not known
    here) cannot be split into `groups` replica groups. The groups divide data parallel,
    and each is a whole number of nodes (its own Slurm job); everything else (ZeRO/FSDP,
    tp, pp with its virtual stages and schedule, cp) is laid out inside each group as the
    layout says, and each rank's peers in the other groups are the ranks at its mesh
    coordinates. The one predicate the planner, the API and the worker apply."""
    problems = []
    if layout.dp % groups:
        problems.append(
            ("dp", f"data parallel {layout.dp} is not a multiple of {groups} replica groups")
        )
    if num_nodes is not None and num_nodes % groups:
        problems.append(
            ("nodes", f"{num_nodes} nodes do not split into {groups} groups of whole nodes")
        )
    return problems


def group_layout(layout: ParallelLayout, groups: int) -> ParallelLayout:
    """The layout one replica group trains with: its share of data parallel."""
    return layout.model_copy(update={"dp": layout.dp // groups})
