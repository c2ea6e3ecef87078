"""Replica groups (torchft): the survivors' timeout and the lighthouses."""

from __future__ import annotations

from pydantic import Field, field_validator

from service.config_areas.base import AreaSettings


class ReplicaGroupSettings(AreaSettings):
    """Replica groups (torchft).

    For runs of replica groups that train on while a group is lost: how long the others
    wait for it, and the lighthouse the service starts per run (its executable, the
    address and ports it listens on, which a site's firewall must match)."""

    replica_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Replica groups: how long survivors wait on a dead group's collective or "
        "quorum before stepping without it (torchft's timeout; a 10 s timeout stalled a "
        "two-group toy for about 5 s).",
    )
    lighthouse_command: str = Field(
        default="torchft_lighthouse",
        description="The torchft lighthouse executable the service starts per replica-group "
        "run (a name on PATH or beside the service's Python, or a path).",
    )
    lighthouse_host: str = Field(
        default="127.0.0.1",
        description="The address compute nodes reach this host at for the lighthouse.",
    )
    lighthouse_bind_addr: str | None = Field(
        default=None,
        description="The address lighthouses listen on: one of this host's, on the network "
        "the compute nodes use (default: RUNYARD_LIGHTHOUSE_HOST, where the ranks reach it). "
        "A lighthouse has no authentication, and whoever joins its quorum can make a group "
        "heal from them (torchft unpickles what a peer sends): never 0.0.0.0 or ::.",
    )
    lighthouse_ports: str = Field(
        default="",
        pattern=r"^(\d{1,5}-\d{1,5})?$",
        description="LOW-HIGH: the ports lighthouses listen on (one per replica-group run), "
        "for a firewall rule that lets only the compute nodes reach them; empty: any free "
        "port the kernel picks.",
    )

    @field_validator("lighthouse_ports")
    @classmethod
    def _port_range(cls, text: str) -> str:
        if text:
            low, high = (int(port) for port in text.split("-"))
            if not 1 <= low <= high <= 65535:
                raise ValueError(f"{text!r}: want LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
        return text
