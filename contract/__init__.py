"""What the service and the worker agree on, importing neither (pydantic, and the protocol
constants of runyard-client, which imports nothing of runyard's; no torch).

The user-facing run spec (with `auto` and defaults) belongs to the service's API; what the
planner resolves it into lives here: the model shape, the one layout type and the one rule
set for it, the worker's run config, exit codes and stop reasons. Dependencies point one
way, `client -> HTTP -> service -> contract <- worker`, and `make lint` keeps them so.
"""

# What runyard-client and the service agree on over HTTP (the worker protocol's version and
# header, the report timeout and backoff) is defined in runyard-client, which imports
# nothing of runyard's so that it installs alone; contract re-exports it for the service.
from runyard_client.protocol import (
    MAX_REPORT_BACKOFF_S,
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    REPORT_REQUEST_TIMEOUT_S,
    UNVERSIONED_PROTOCOL,
    protocol_advice,
)

from .dataset import (
    DatasetIndex,
    DatasetIndexError,
    DatasetProblem,
    TokenizerIdentity,
    check_dataset,
    dataset_problems,
    read_dataset_index,
)
from .entrypoint import Entrypoint
from .exit_codes import ExitCode
from .fault_tolerance import ReplicaGroupConfig, group_layout, replica_layout_problems
from .hf_config import (
    HfCheckpointError,
    hf_config_from_shape,
    hf_weight_files,
    read_hf_checkpoint,
    shape_from_hf_config,
)
from .layout import (
    Float8Scaling,
    LayoutProblem,
    ParallelLayout,
    PipelineSchedule,
    Precision,
    ProblemKind,
    Recompute,
    degree_problems,
    layout_problems,
    schedule_problems,
)
from .model_shape import ModelShape
from .run_config import ResumePoint, WorkerRunConfig
from .stop_reasons import StopReason

__all__ = [
    "MAX_REPORT_BACKOFF_S",
    "PROTOCOL_HEADER",
    "PROTOCOL_VERSION",
    "REPORT_REQUEST_TIMEOUT_S",
    "UNVERSIONED_PROTOCOL",
    "DatasetIndex",
    "DatasetIndexError",
    "DatasetProblem",
    "Entrypoint",
    "ExitCode",
    "Float8Scaling",
    "HfCheckpointError",
    "LayoutProblem",
    "ModelShape",
    "ParallelLayout",
    "PipelineSchedule",
    "Precision",
    "ProblemKind",
    "Recompute",
    "ReplicaGroupConfig",
    "ResumePoint",
    "StopReason",
    "TokenizerIdentity",
    "WorkerRunConfig",
    "check_dataset",
    "dataset_problems",
    "degree_problems",
    "group_layout",
    "hf_config_from_shape",
    "hf_weight_files",
    "layout_problems",
    "protocol_advice",
    "read_dataset_index",
    "read_hf_checkpoint",
    "replica_layout_problems",
    "schedule_problems",
    "shape_from_hf_config",
]
