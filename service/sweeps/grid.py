"""Expand a sweep's grid into the member run specs, refusing what one job array cannot run."""

from __future__ import annotations

import itertools
import math
from typing import Any

from pydantic import ValidationError

from service.errors import InvalidSpec
from service.runs.schemas import RunSpec
from service.sweeps.schemas import (
    MAX_SWEEP_RUNS,
    SWEEPABLE,
    SWEEPABLE_PARALLELISM,
    SweepSpec,
)


def _check_key(key: str) -> None:
    head, _, field = key.partition(".")
    if (not field and key in SWEEPABLE) or (
        head == "parallelism" and field in SWEEPABLE_PARALLELISM
    ):
        return
    raise InvalidSpec(
        f"sweep.grid.{key}: not a field a sweep can vary. One job array shares one Slurm "
        "request, so nodes, gpus_per_node, time_limit_min, priority and min_nodes are fixed; "
        f"vary one of {', '.join(SWEEPABLE)} or parallelism.<field>"
    )


def _with(base: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    head, _, field = key.partition(".")
    if not field:
        return {**base, key: value}
    nested = base.get(head)
    nested = {} if nested in (None, "auto") else dict(nested)
    return {**base, head: {**nested, field: value}}


def expand(spec: SweepSpec) -> list[tuple[dict[str, Any], RunSpec]]:
    """(grid point, member spec) per combination, in a stable order (the array's order)."""
    grid = spec.sweep.grid
    for key, values in grid.items():
        _check_key(key)
        if not values:
            raise InvalidSpec(f"sweep.grid.{key}: give at least one value")
    count = math.prod(len(v) for v in grid.values())
    if count < 2:
        raise InvalidSpec(
            "sweep.grid: it has one combination only; submit it as a plain run (without sweep)"
        )
    if count > MAX_SWEEP_RUNS:
        raise InvalidSpec(
            f"sweep.grid: {count} combinations; one job array holds at most {MAX_SWEEP_RUNS} "
            "(Slurm's MaxArraySize): split the grid into several sweeps"
        )
    base = spec.model_dump(mode="json", exclude={"sweep"})
    width = len(str(count - 1))
    members = []
    for index, combo in enumerate(itertools.product(*grid.values())):
        point = dict(zip(grid, combo, strict=True))
        raw = {**base, "name": f"{spec.name}-{index:0{width}d}"}
        for key, value in point.items():
            raw = _with(raw, key, value)
        try:
            member = RunSpec.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "spec"
            raise InvalidSpec(
                f"sweep.grid: the point {point} gives an invalid run: {where}: {first['msg']}"
            ) from exc
        members.append((point, member))
    return members
