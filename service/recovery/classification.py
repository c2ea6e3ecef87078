"""The classification table: which signal asks for which recovery action.

Data, not if-chains: operators override rows with RUNYARD_CLASSIFICATION_FILE (a JSON object
{"xid:94": "DRAIN_AND_MOVE", ...}). Xid meanings and the recommended handling come from
NVIDIA's "Xid Errors" catalog (docs.nvidia.com/deploy/xid-errors, r555 and later; the
column "Immediate action") and the "GPU Memory Error Management" guide
(docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt) for ECC, row remapping and page retirement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from service.models import RecoveryAction

A = RecoveryAction


@dataclass(frozen=True)
class Rule:
    action: RecoveryAction
    why: str


DEFAULT_RULES: dict[str, Rule] = {
    # Xid 13 "Graphics Engine Exception": usually the application (illegal instruction or
    # out-of-range access); NVIDIA: "run diagnostics if it repeats". Count, escalate.
    "xid:13": Rule(A.COUNT_AND_ESCALATE, "graphics engine exception, usually the application"),
    # Xid 31 "GPU memory page fault": an illegal address in the application; NVIDIA:
    # "debug the application", hardware only if it repeats across applications.
    "xid:31": Rule(A.COUNT_AND_ESCALATE, "GPU memory page fault, usually the application"),
    # Xid 43 "GPU stopped processing": the user application faulted; the GPU stays healthy.
    "xid:43": Rule(A.COUNT_AND_ESCALATE, "GPU stopped processing after an application fault"),
    # Xid 45 "Preemptive cleanup": follows other errors or a killed process; no action itself.
    "xid:45": Rule(A.OBSERVE, "preemptive cleanup after another error"),
    # Xid 48 "Double Bit ECC Error": uncorrectable; NVIDIA: reset the GPU (drain the node).
    "xid:48": Rule(A.DRAIN_AND_MOVE, "double-bit ECC error, GPU reset required"),
    # Xid 63 "ECC page retirement or row remapping recording event": the remap is pending
    # until the next reset; the GPU keeps working. Recorded; NVML's pending-remap check drains.
    "xid:63": Rule(A.OBSERVE, "row remap recorded, effective at next reset"),
    # Xid 64 "ECC page retirement or row remapper recording failure": memory cannot be
    # repaired in place; NVIDIA: reset, then field diagnostics.
    "xid:64": Rule(A.DRAIN_AND_MOVE, "row remapping failed"),
    # Xid 74 "NVLink Error": a link is down; collectives on this node will fail or crawl.
    "xid:74": Rule(A.DRAIN_AND_MOVE, "NVLink error"),
    # Xid 79 "GPU has fallen off the bus": the GPU is gone until the node is reset.
    "xid:79": Rule(A.DRAIN_AND_MOVE, "GPU has fallen off the bus"),
    # Xid 92 "High single-bit ECC error rate": corrected errors; watch, do not drain.
    "xid:92": Rule(A.OBSERVE, "high single-bit ECC rate (corrected)"),
    # Xid 94 "Contained ECC error": the error was contained to the affected application;
    # NVIDIA: restart the application, the GPU can stay in service.
    "xid:94": Rule(A.RESTART_SAME_NODES, "contained ECC error, restart the application"),
    # Xid 95 "Uncontained ECC error": all applications on the GPU are affected; reset.
    "xid:95": Rule(A.DRAIN_AND_MOVE, "uncontained ECC error, GPU reset required"),
    # Xid 119 / 120 "GSP RPC timeout" / "GSP error": the GPU System Processor hung; reset.
    "xid:119": Rule(A.DRAIN_AND_MOVE, "GSP RPC timeout"),
    "xid:120": Rule(A.DRAIN_AND_MOVE, "GSP error"),
    # NVSwitch SXid: fatal ones take the node's NVLink fabric down (Fabric Manager guide,
    # "NVSwitch errors": fatal SXids need a reset of the switch tray, i.e. of the node).
    "sxid:fatal": Rule(A.DRAIN_AND_MOVE, "fatal NVSwitch error"),
    "sxid:nonfatal": Rule(A.OBSERVE, "non-fatal NVSwitch error"),
    # NVML: a pending row remap or a pending retired page needs a GPU reset to take effect;
    # a volatile double-bit ECC count means uncorrectable errors occurred.
    "nvml:pending_row_remap": Rule(A.DRAIN_AND_MOVE, "row remap pending, reset required"),
    "nvml:retired_pages_pending": Rule(A.DRAIN_AND_MOVE, "retired pages pending a reset"),
    "nvml:double_bit_ecc": Rule(A.DRAIN_AND_MOVE, "uncorrectable ECC errors counted"),
    "nvml:thermal_throttle": Rule(A.OBSERVE, "clocks throttled by temperature or power"),
    # NCCL / gloo failures reported by a rank: a peer died or the network hiccupped. Restart
    # without draining; the node is drained only when its hardware signals say so.
    "nccl:watchdog_timeout": Rule(A.RESTART, "collective watchdog timeout"),
    "nccl:remote_error": Rule(A.RESTART, "ncclRemoteError: a peer failed"),
    "nccl:system_error": Rule(A.RESTART, "ncclSystemError"),
    "nccl:internal_error": Rule(A.RESTART, "ncclInternalError"),
    "nccl:connection_reset": Rule(A.RESTART, "connection reset by a peer"),
    "nccl:log_error": Rule(A.OBSERVE, "NCCL WARN/error line in a run log"),
    # Detected by the service itself.
    "heartbeat:lost": Rule(A.DRAIN_AND_MOVE, "no heartbeat: the node is presumed dead"),
    "slurm:node_down": Rule(A.DRAIN_AND_MOVE, "Slurm reports the node down/not responding"),
    "hang:no_progress": Rule(A.RESTART, "the step counter stopped moving"),
    # Issue 15: a node persistently slower than its peers, under the `move` policy
    # (service/recovery/slow_nodes.py), and data-parallel replicas whose parameters
    # differ (service/recovery/sdc.py): Llama 3 counts silent data corruption as 1.4% of its
    # interruptions, a hardware fault like a dead GPU.
    "node:slow": Rule(A.DRAIN_AND_MOVE, "persistently slower than its peers (policy move)"),
    "sdc:mismatch": Rule(A.DRAIN_AND_MOVE, "silent data corruption: replicas' parameters differ"),
}

UNKNOWN = Rule(A.OBSERVE, "not in the classification table")


class Classifier:
    """The default table with an operator's overrides on top."""

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.rules = dict(DEFAULT_RULES)
        for signal, action in (overrides or {}).items():
            self.rules[signal] = Rule(RecoveryAction(action), "operator override")

    @classmethod
    def from_file(cls, path: Path | None) -> Classifier:
        if path is None:
            return cls()
        return cls(json.loads(path.read_text()))

    def classify(self, signal: str) -> Rule:
        return self.rules.get(signal, UNKNOWN)


def signal_name(kind: str, code: int | None) -> str:
    """The table key of an event: `xid` + 79 -> "xid:79"; "nvml:..." kinds are their own."""
    return f"{kind}:{code}" if ":" not in kind and code is not None else kind
