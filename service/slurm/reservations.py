"""Slurm reservations: how runyard holds spares and keeps a run's nodes between attempts.

Two kinds, both owned by runyard and named with the service's job prefix:
- `<prefix>-spares`: the hot-spare pool; ordinary jobs cannot start on its nodes.
- `<prefix>-run<id>`: one per run, holding the run's nodes across attempts so other pending
  jobs cannot grab a healthy node while a failed attempt is being replaced. A job inside a
  reservation cannot use nodes outside it, so a spare moves *into* the run's reservation
  (out of the spare one) before the next attempt is submitted with `--reservation`.
"""

from __future__ import annotations

import getpass

from service.slurm.commands import SlurmError, parse_key_values, run_slurm


def spare_reservation(prefix: str) -> str:
    return f"{prefix}-spares"


def run_reservation(prefix: str, run_id: int) -> str:
    return f"{prefix}-run{run_id}"


def list_reservations() -> dict[str, list[str]]:
    """Reservation name -> its nodes (expanded)."""
    out = run_slurm(["scontrol", "show", "reservation", "-o"], check=False)
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        fields = parse_key_values(line)
        if "ReservationName" in fields:
            nodes = fields.get("Nodes", "")
            found[fields["ReservationName"]] = (
                run_slurm(["scontrol", "show", "hostnames", nodes]).split() if nodes else []
            )
    return found


def ensure_reservation(name: str, nodes: list[str], current: dict[str, list[str]]) -> None:
    """Make reservation `name` hold exactly `nodes` (create, update or delete); idempotent.

    `current` is the tick's snapshot; it is kept up to date here, so a later step of the
    same tick does not act on what an earlier one already changed.
    """
    have = current.get(name)
    if not nodes:
        delete_reservation(name, current)
        return
    if have is not None and sorted(have) == sorted(nodes):
        return
    node_arg = f"nodes={','.join(sorted(nodes))}"
    if have is None:
        # IGNORE_JOBS: a node may still finish a job of ours; MAINT: reservations may overlap
        # while a spare moves from the pool into a run.
        try:
            run_slurm(
                [
                    "scontrol",
                    "create",
                    f"reservation={name}",
                    node_arg,
                    "starttime=now",
                    "duration=infinite",
                    f"users={getpass.getuser()}",
                    "flags=ignore_jobs,maint",
                ]
            )
        except SlurmError as exc:
            if "Duplicate reservation name" not in str(exc):
                raise
            run_slurm(["scontrol", "update", f"reservation={name}", node_arg])
    else:
        run_slurm(["scontrol", "update", f"reservation={name}", node_arg])
    current[name] = list(nodes)


def delete_reservation(name: str, current: dict[str, list[str]]) -> None:
    """Delete it whether or not the snapshot knew of it (it may be newer than the snapshot)."""
    run_slurm(["scontrol", "delete", f"reservation={name}"], check=False)
    current.pop(name, None)
