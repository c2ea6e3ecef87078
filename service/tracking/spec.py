"""A run spec's `tracking:` section: which experiment trackers get the run.

```yaml
tracking:
  mlflow: {experiment: llama-pretrain}   # the site's MLflow server (RUNYARD_MLFLOW_TRACKING_URI)
  wandb: {project: llama, entity: my-team}  # offline under RUNYARD_WANDB_DIR, or online
  tensorboard: true                     # event files under RUNYARD_TENSORBOARD_ROOT
```
Where each tracker is comes from the site's settings; the spec only says which ones the run
goes to and under what name.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from service.config import Settings
from service.models import TrackerKind


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MlflowTracking(_Spec):
    experiment: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The MLflow experiment (created if missing; default: the team's name).",
    )


class WandbTracking(_Spec):
    project: str = Field(min_length=1, max_length=128, description="The W&B project.")
    entity: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The W&B entity (default: the site's RUNYARD_WANDB_ENTITY).",
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


def unavailable(spec: TrackingSpec | None, settings: Settings) -> str | None:
    """Why this site cannot take the spec's trackers (naming the field), or None."""
    if spec is not None and spec.mlflow is not None and not settings.mlflow_tracking_uri:
        return (
            "tracking.mlflow: this site has no MLflow tracking server "
            "(RUNYARD_MLFLOW_TRACKING_URI is unset); remove tracking.mlflow or ask an admin"
        )
    return None
