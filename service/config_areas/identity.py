"""Who a run runs as: the users the service may act as, and what reaches their jobs."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from service.config_areas.base import AreaSettings


class ServiceEnvironment(StrEnum):
    """Whose jobs the service submits: a site's users', or the dev cluster's and the tests'."""

    SITE = "site"
    # The test fault hooks of the service's environment (RUNYARD_FAULT*, worker/faults.py)
    # go into every job it submits (service/identity/gate.py): crashes, slowed steps.
    DEV = "dev"


class IdentitySettings(AreaSettings):
    """Who a run runs as.

    The Unix users the service may act as (sudo, one narrow rule: docs/install.md step 3),
    the permissions their runs' files get, and whether the service's own environment
    reaches their jobs (a test rig's only)."""

    owner_group: str = Field(
        default="runyard-users",
        description="The Unix group of the users the service may act as (the sudoers rule's "
        "Runas list): a user is linked only to a login in it.",
    )
    owner_python: str | None = Field(
        default=None,
        description="The Python the service acts as a run's owner with: `sudo -n -u <owner> "
        "<owner_python> -I -m service.identity.as_owner`, the one command the sudoers rule "
        "allows (docs/install.md step 3; default: the service's own Python).",
    )
    run_umask: str = Field(
        default="0027",
        pattern="^0?[0-7]{3}$",
        description="The umask a run's jobs and the files made for them at submission get "
        "(octal): 0027 makes job folders, logs and checkpoints the owner's, readable by "
        "the owner's primary group (the team), and nothing for others.",
    )
    environment: ServiceEnvironment = Field(
        default=ServiceEnvironment.SITE,
        description="site: users' jobs get nothing of the service's environment. dev (the dev "
        "cluster's and the tests' services only): the test fault hooks set in it "
        "(RUNYARD_FAULT*: crashes, slowed steps, flipped values) reach every job it submits. "
        "`runyard doctor` fails a site service that has one set.",
    )

    @property
    def umask(self) -> int:
        return int(self.run_umask, 8)
