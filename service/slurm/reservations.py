"""Slurm reservations: how runyard holds spares and keeps a run's nodes between attempts.

Two kinds, both owned by runyard and named with the service's job prefix:
- `<prefix>-spares`: the hot-spare pool; ordinary jobs cannot start on its nodes.
- `<prefix>-run<id>`: one per run, holding the run's nodes across attempts so other pending
  jobs cannot grab a healthy node while a failed attempt is being replaced. A job inside a
  reservation cannot use nodes outside it, so a spare moves *into* the run's reservation
  (out of the spare one) before the next attempt is submitted with `--reservation`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from service.slurm.client import SlurmClient


def spare_reservation(prefix: str) -> str:
    return f"{prefix}-spares"


def run_reservation(prefix: str, run_id: int) -> str:
    return f"{prefix}-run{run_id}"


def run_of_reservation(prefix: str, name: str) -> int | None:
    """The run whose reservation `name` is, or None for one that is not a run's of ours (the
    spare pool's, another service's, an operator's): the inverse of run_reservation."""
    found = re.fullmatch(rf"{re.escape(prefix)}-run([0-9]+)", name)
    if found is None:
        return None
    run_id = int(found[1])
    return run_id if run_reservation(prefix, run_id) == name else None  # not `-run07`


def ensure_reservation(
    slurm: SlurmClient,
    name: str,
    nodes: Sequence[str],
    current: dict[str, list[str]],
    users: Sequence[str] = (),
) -> None:
    """Make reservation `name` hold exactly `nodes` (create, update or delete); idempotent.
    `users` besides the service may run jobs in it: a run's owner, in the run's own.

    `current` is the tick's snapshot; it is kept up to date here, so a later step of the
    same tick does not act on what an earlier one already changed.
    """
    have = current.get(name)
    if not nodes:
        delete_reservation(slurm, name, current)
        return
    if have is not None and sorted(have) == sorted(nodes):
        return
    if have is None:
        slurm.create_reservation(name, nodes, users)
    else:
        slurm.update_reservation(name, nodes)
    current[name] = list(nodes)


def delete_reservation(slurm: SlurmClient, name: str, current: dict[str, list[str]]) -> None:
    """Delete it whether or not the snapshot knew of it (it may be newer than the snapshot).
    A refusal (SlurmError) propagates and leaves it in `current`: it is still there."""
    slurm.delete_reservation(name)
    current.pop(name, None)
