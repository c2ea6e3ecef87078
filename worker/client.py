"""runyard-client's session API under its old name, for scripts that import it from here.

A training script of your own imports `runyard_client` (the runyard-client distribution,
which installs alone into the script's environment); this module re-exports it, with the
environment variables the launcher (worker/entrypoint.py) sets, so that scripts written
against `worker.client` keep running in runyard's own environment.
"""

from runyard_client import PROTOCOL_VERSION, ProtocolMismatchError, Resume, Session, connect
from runyard_client.session import (
    ENV_ATTEMPT_ID,
    ENV_CHECKPOINT_DIR,
    ENV_METRICS_FILE,
    ENV_NODE,
    ENV_REPORT_INTERVAL_S,
    ENV_RESUME_PATH,
    ENV_RESUME_STEP,
    ENV_SERVICE_URL,
    ENV_STEPS,
)

__all__ = [
    "ENV_ATTEMPT_ID",
    "ENV_CHECKPOINT_DIR",
    "ENV_METRICS_FILE",
    "ENV_NODE",
    "ENV_REPORT_INTERVAL_S",
    "ENV_RESUME_PATH",
    "ENV_RESUME_STEP",
    "ENV_SERVICE_URL",
    "ENV_STEPS",
    "PROTOCOL_VERSION",
    "ProtocolMismatchError",
    "Resume",
    "Session",
    "connect",
]
