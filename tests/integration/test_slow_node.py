"""A slowed rank on the real cluster (issue 15): from step 4 on, rank 1 of the first attempt
sleeps 0.3 s in every update (RUNYARD_FAULT slow_step). Its node is flagged SLOW after 5
consecutive slow reports (within 40 steps of the slowdown: see FLAG_WITHIN_STEPS), shown in
`node show` and /metrics; the service's default
policy `move` asks the run to checkpoint and yield, drains the node and a spare takes its
place; the run finishes. The flag came from the run's own timings, so the move is one of its
max_restarts (service/recovery/claims.py)."""

from __future__ import annotations

import httpx
import pytest
from runyard_client.tls import client_context

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import ServiceProcess, drain_reason, ended, inject_faults, tiny_spec

pytestmark = [pytest.mark.integration, pytest.mark.whole_path]

SLOW_RUN = "slow-node"
# Flagged at the 5th slow report. The first report after the slowdown may come only at the
# checkpoint at step 20 (the fast steps before it asked for a long window); then one comes
# every report_interval_s (2 s), about 5 slowed steps of ~0.35 s: by step 20 + 4 x 5 = 40.
SLOW_FROM, FLAG_WITHIN_STEPS = 4, 40
FAULTS = (f"slow_step:{SLOW_FROM}:1:1@{SLOW_RUN}",)  # rank 1, attempt 1 only
inject_faults(*FAULTS)


@pytest.mark.timeout(240)
def test_a_slowed_rank_flags_its_node_and_the_run_moves_to_a_spare(
    service: ServiceProcess,
    spare_pool: RunyardClient,
    slurm_cluster,  # type: ignore[no-untyped-def]
) -> None:
    client = spare_pool
    spare = client.get_spares()["members"][0]
    # The "tiny" preset's two blocks: FLAG_WITHIN_STEPS counts its slowed steps (~0.35 s).
    spec = tiny_spec(SLOW_RUN, model="tiny", steps=80, checkpoint_every=20, max_restarts=1)
    run_id = client.submit_run(spec)["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=200)

    first, second = run["attempts"]
    assert run["state"] == "SUCCEEDED", (run["state_reason"], run["attempts"])
    assert [first["stop_reason"], second["stop_reason"]] == ["slow_node", "completed"]
    assert (run["num_restarts"], run["num_hardware_restarts"]) == (1, 0)
    slow = first["nodes"][1]  # rank 1's node (one rank per node, in node order)
    [flagged] = [e for e in client.run_events(run_id) if e["kind"] == "recovery.slow_node"]
    assert flagged["data"]["node"] == slow and flagged["data"]["ratio"] > 1.25
    assert flagged["data"]["step"] <= SLOW_FROM + FLAG_WITHIN_STEPS, flagged
    # Moved at the checkpoint it took when asked: no step lost, on the spare.
    assert second["resume_step"] >= flagged["data"]["step"]
    assert slow not in second["nodes"] and spare in second["nodes"]

    node = client.get_node(slow)
    assert node["slow_since"] and node["slow_ratio"] > 1.25 and node["state"] == "DRAINED"
    assert "slow" in drain_reason(slow, str(slurm_cluster.slurm_conf))
    assert "node.slow" in [e["kind"] for e in node["events"]]
    metrics = httpx.get(
        f"{service.url}/metrics",
        headers={"Authorization": f"Bearer {service.admin_token}"},
        timeout=10,
        verify=client_context(),
    ).text
    cluster = slurm_cluster.cluster_name  # a node is named within its cluster
    assert f'runyard_node_slow{{cluster="{cluster}",node="{slow}"}} 1.0' in metrics
