"""A torchrun script that never imports runyard gets runyard's recovery unchanged:
examples/plain_torchrun.py (plain PyTorch, DCP `step-N` checkpoints, `step N loss X` lines,
--save-dir and --resume flags) runs on two nodes of the dev cluster with `progress:` and
`resume:` in its spec. One node logs Xid 79: it is drained, a spare takes its place and the
script resumes from its newest checkpoint, which rank 0's launcher found complete by DCP's
`.metadata` and committed. A SIGSTOPped rank silences rank 0's output (its peer waits in a
collective), and the run is found hung from that silence alone and restarted."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    lose_a_node_and_resume,
    tiny_spec,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO_ROOT / "examples" / "plain_torchrun.py")
STEP_LINE = r"step (?P<step>\d+) loss (?P<loss>\S+)"
# The tests' service paces runyard's trainer (STEP_PACE_S); the script paces itself.
PACE_S = "0.06"


def plain_spec(name: str, steps: int, every: int) -> dict[str, Any]:
    args = ["--steps", str(steps), "--checkpoint-every", str(every), "--pace-s", PACE_S]
    return tiny_spec(
        name,
        steps=steps,
        entrypoint={"script": EXAMPLE, "args": args},
        progress={"pattern": STEP_LINE},
        resume={"save_flag": "--save-dir", "flag": "--resume"},
    )


def running_attempt(client: RunyardClient, run_id: int, number: int) -> dict[str, Any] | None:
    attempts = client.get_run(run_id)["attempts"]
    if len(attempts) >= number and attempts[number - 1]["state"] == "RUNNING":
        return attempts[number - 1]
    return None


def script_pids(service_url: str, attempt_id: int) -> list[int]:
    """The scripts' processes, lowest rank first: each the child of its rank's launcher."""
    from client.devcluster.faults import rank_pids

    found = []
    for launcher in rank_pids(service_url, attempt_id):
        children = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True)
        found += [int(pid) for pid in children.stdout.split()]
    return found


@pytest.mark.timeout(600)
def test_a_plain_script_resumes_on_a_spare_from_the_checkpoint_its_launcher_committed(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster: Any
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    run_id = client.submit_run(plain_spec("plain-script-xid", steps=600, every=20))["id"]
    moved = lose_a_node_and_resume(client, run_id, agents, conf)
    (commit,) = [c for c in client.run_checkpoints(run_id) if c["step"] == moved.first_commit]
    assert Path(commit["path"]).name == f"step-{moved.first_commit}"  # the script's own layout
    resume_step = moved.resume_step
    assert resume_step % 20 == 0  # the script's own cadence
    resumed_from = next(
        c["path"] for c in client.run_checkpoints(run_id) if c["step"] == resume_step
    )

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=240
    )
    final = client.get_run(run_id)
    assert final["num_hardware_restarts"] == 1 and final["last_step"] == 600
    log = client.run_logs(run_id, attempt=2, rank=0)["text"]
    assert f"--resume {resumed_from}" in log, log[-2000:]  # the launcher's command line
    assert f"resumed from {resumed_from} at step {resume_step}" in log, log[-2000:]
    assert f"step {resume_step + 1} loss " in log  # the script's own line, as it printed it
    steps = [m["step"] for m in client.run_metrics(run_id, after_step=resume_step)]
    assert min(steps) == resume_step + 1  # read from its output, from there on
    assert 600 in committed(client, run_id)  # its last save, committed at its clean exit


@pytest.mark.timeout(600)
def test_a_stopped_rank_silences_the_scripts_output_and_is_a_hang(
    service: ServiceProcess, agents: Agents
) -> None:
    client = service.client()
    run_id = client.submit_run(plain_spec("plain-script-sigstop", steps=4000, every=50))["id"]
    wait_for("steps read from its output", lambda: (client.get_run(run_id)["last_step"] or 0) > 5)
    first = client.get_run(run_id)["attempts"][0]
    pids = wait_for("the scripts", lambda: script_pids(service.url, first["id"]))
    assert len(pids) == 2
    os.kill(pids[-1], signal.SIGSTOP)  # alive, silent; rank 0 waits in its all-reduce
    try:
        second = wait_for(
            "attempt 2 after the hang", lambda: running_attempt(client, run_id, 2), timeout_s=90
        )
    finally:
        with contextlib.suppress(ProcessLookupError):  # Slurm may have ended it already
            os.kill(pids[-1], signal.SIGCONT)
    assert sorted(second["nodes"]) == sorted(first["nodes"]), "a hang keeps the nodes"
    incident = next(i for i in client.list_incidents() if i["run_id"] == run_id)
    assert incident["kind"] == "hang" and incident["action"] == "RESTART", incident
    assert all(client.get_node(n)["state"] != "DRAINED" for n in first["nodes"])
    client.cancel_run(run_id)
    wait_for("the run cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED")
