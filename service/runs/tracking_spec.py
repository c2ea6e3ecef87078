"""A run spec's `tracking:` section: which experiment trackers get the run.

```yaml
tracking:
  mlflow: {experiment: llama-pretrain}   # the site's MLflow server (RUNYARD_MLFLOW_TRACKING_URI)
  wandb: {project: llama, entity: my-team}  # offline under RUNYARD_WANDB_DIR, or online
  tensorboard: true                     # event files under RUNYARD_TENSORBOARD_ROOT
```
Where each tracker is comes from the site's settings; the spec only says which ones the run
goes to and under what name. The exporters (service/tracking/) read it from the run.

The service writes to MLflow and W&B with its own credentials, so a name is all that keeps
one team's runs out of another's experiments: each team has a namespace (`<team>` and
`<team>/...` in MLflow; `<team>` and `<team>-...` in W&B, whose project names cannot hold a
"/"), and a run naming anything else is refused at submission with a 422 naming the field.
Refused rather than prefixed by the service: the name a user types is the name they find
in the tracker.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Team, TrackerKind


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MlflowTracking(_Spec):
    experiment: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The MLflow experiment (created if missing; default: the team's name): "
        "the team's name, or one that starts with it and a slash (`vision/llama`).",
    )


class WandbTracking(_Spec):
    project: str = Field(
        min_length=1,
        max_length=128,
        description="The W&B project: the team's name, or one that starts with it and a "
        "hyphen (`vision-llama`).",
    )
    entity: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The W&B entity: the site's RUNYARD_WANDB_ENTITY, the default; no other.",
    )


class TrackingSpec(_Spec):
    """The trackers a run is exported to by the service (each step once, across restarts)."""

    mlflow: MlflowTracking | None = Field(default=None, description="Log to the site's MLflow.")
    wandb: WandbTracking | None = Field(default=None, description="Log to Weights & Biases.")
    tensorboard: bool = Field(default=False, description="Write TensorBoard event files.")

    @property
    def trackers(self) -> list[TrackerKind]:
        wanted = [(self.mlflow, TrackerKind.MLFLOW), (self.wandb, TrackerKind.WANDB)]
        kinds = [kind for section, kind in wanted if section is not None]
        return kinds + ([TrackerKind.TENSORBOARD] if self.tensorboard else [])


def unavailable(
    spec: TrackingSpec | None,
    settings: Settings,
    session: Session | None = None,
    team: str | None = None,
) -> str | None:
    """Why this site cannot take the spec's trackers for a run of `team` (naming the field),
    or None. Without a session and a team (the service's own runs), names are not checked."""
    if spec is not None and spec.mlflow is not None and not settings.mlflow_tracking_uri:
        return (
            "tracking.mlflow: this site has no MLflow tracking server "
            "(RUNYARD_MLFLOW_TRACKING_URI is unset); remove tracking.mlflow or ask an admin"
        )
    if spec is None or session is None or team is None:
        return None
    if spec.mlflow is None and spec.wandb is None:
        return None
    return outside_namespace(spec, team, session.scalars(select(Team.name)).all(), settings)


def outside_namespace(
    spec: TrackingSpec | None, team: str, teams: Collection[str], settings: Settings
) -> str | None:
    """Why a tracker name of `team`'s run lies outside the team's namespace (naming the
    field), or None. `teams`: every team, for W&B's hyphen, which team names hold too."""
    if spec is None:
        return None
    if spec.mlflow is not None and spec.mlflow.experiment is not None:
        name = spec.mlflow.experiment
        if name != team and not name.startswith(f"{team}/"):
            return (
                f"tracking.mlflow.experiment: {name!r} is outside team {team}'s experiments: "
                f"name it {team!r} or {team}/<name> (the service writes to MLflow for every "
                "team, so a team's runs write only under its own name)"
            )
    if spec.wandb is not None:
        name = spec.wandb.project
        owner = _wandb_owner(name, {*teams, team})
        if owner != team:
            also = f"; it is team {owner}'s" if owner is not None else ""
            return (
                f"tracking.wandb.project: {name!r} is outside team {team}'s projects{also}: "
                f"name it {team!r} or {team}-<name> (the service writes to W&B for every team, "
                "so a team's runs write only under its own name)"
            )
        entity = spec.wandb.entity
        if entity is not None and entity != settings.wandb_entity:
            site = settings.wandb_entity
            return (
                f"tracking.wandb.entity: {entity!r} is not this site's W&B entity "
                f"({site!r}, RUNYARD_WANDB_ENTITY): leave entity out"
                if site
                else f"tracking.wandb.entity: {entity!r}: this site names no W&B entity "
                "(RUNYARD_WANDB_ENTITY), and the service writes to no other: leave entity out"
            )
    return None


def _wandb_owner(project: str, teams: Collection[str]) -> str | None:
    """The team whose namespace holds a W&B project: the longest team name it equals or
    starts with followed by a hyphen (team `ml-infra`'s `ml-infra-x` is not team `ml`'s)."""
    owners = [t for t in teams if project == t or project.startswith(f"{t}-")]
    return max(owners, key=len, default=None)
