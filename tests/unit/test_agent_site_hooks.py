"""The agent's site hooks: the health check's kernel-log reading and its Xid set, the
prolog/epilog event, and the settings reference generated from service/config.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import config_doc
from service.models import RecoveryAction
from service.recovery.classification import DEFAULT_RULES
from worker.agent.healthcheck import RESET_XIDS, Problem, kernel_problems
from worker.agent.slurm_hook import Phase, job_event

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:3b:00): 13, pid=1234, name=python, Graphics Exception"
SXID_FATAL = "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 46 LTSSM Fault Up"


def test_reset_xids_are_the_services_drain_rows() -> None:
    drains = {
        int(signal.split(":")[1])
        for signal, rule in DEFAULT_RULES.items()
        if signal.startswith("xid:") and rule.action is RecoveryAction.DRAIN_AND_MOVE
    }
    assert drains == RESET_XIDS


def test_health_check_reads_only_new_lines_and_only_reset_class_signals(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "state"
    log.write_text(f"boot\n{XID_13}\n{XID_79}\n")
    found = kernel_problems(log, state)
    assert [p.what for p in found] == ["xid 79 on PCI:0000:3b:00"]
    assert kernel_problems(log, state) == []  # the same line is not reported twice
    with log.open("a") as f:
        f.write(f"{SXID_FATAL}\nhalf a line")
    assert [p.what for p in kernel_problems(log, state)] == ["sxid:fatal 20034 on PCI:0000:8a:00.0"]


def test_drain_reason_carries_the_prefix_and_fits() -> None:
    reason = Problem("x" * 400).reason()
    assert reason.startswith("runyard: healthcheck: ") and len(reason) == 180


def test_prolog_event_is_keyed_by_job_node_and_phase() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NAME": "runyard-x", "SLURM_JOB_USER": "ana"}
    start = job_event(Phase.PROLOG, "gpu001", env)
    end = job_event(Phase.EPILOG, "gpu001", {**env, "SLURM_JOB_EXIT_CODE2": "0:0"})
    assert start["idempotency_key"] == "gpu001:slurm:42:prolog"
    assert (start["kind"], end["kind"]) == ("slurm:job_start", "slurm:job_end")
    assert start["data"]["job_id"] == 42 and end["data"]["exit_code"] == "0:0"
    with pytest.raises(ValueError, match="SLURM_JOB_ID"):
        job_event(Phase.PROLOG, "gpu001", {})


def test_settings_reference_is_generated_from_settings() -> None:
    """docs/install.md's table and deploy/runyard.env.example list every setting, as
    service/config.py has them (`python -m service.config_doc --write` refreshes them)."""
    assert config_doc.main(["--check"]) == 0
    table = config_doc.settings_table()
    for name in config_doc.Settings.model_fields:
        assert f"`RUNYARD_{name.upper()}`" in table
