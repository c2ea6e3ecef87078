"""A flipped parameter bit on the real cluster (issue 15): three data-parallel replicas
(dp 3, zero_stage 0) compare checksums every 10 steps; after step 12 rank 1 of the first
attempt flips one bit of its parameters (RUNYARD_FAULT flip_param). The comparison at step
20 finds it (10 passed), the node is drained with `sdc:mismatch`, the checkpoint at 15
(after the last clean comparison) is distrusted, and the run resumes from step 10 on a
spare and finishes. The verdict is the run's own claim: the restart is one of max_restarts."""

from __future__ import annotations

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import drain_reason, ended, inject_faults, tiny_spec

pytestmark = [pytest.mark.integration, pytest.mark.whole_path]

SDC_RUN = "sdc-flip"
FAULTS = (f"flip_param:12:1:1@{SDC_RUN}",)  # rank 1, attempt 1 only
inject_faults(*FAULTS)


@pytest.mark.timeout(240)
def test_a_flipped_bit_drains_its_node_and_the_run_resumes_from_a_clean_checkpoint(
    spare_pool: RunyardClient,
    slurm_cluster,  # type: ignore[no-untyped-def]
) -> None:
    client = spare_pool
    spare = client.get_spares()["members"][0]
    spec = tiny_spec(
        SDC_RUN,
        nodes=3,
        global_batch=12,
        steps=30,
        checkpoint_every=5,
        keep_checkpoints=10,
        sdc_check_every=10,
        parallelism={"dp": 3, "zero_stage": 0},
        max_restarts=1,
    )
    run_id = client.submit_run(spec)["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=200)

    first, second = run["attempts"]
    assert run["state"] == "SUCCEEDED", (run["state_reason"], run["attempts"])
    assert [first["stop_reason"], second["stop_reason"]] == ["sdc", "completed"]
    odd = first["nodes"][1]  # rank 1's node
    [rollback] = run["rollbacks"]
    assert rollback["kind"] == "sdc" and rollback["nodes"] == [odd]
    assert (rollback["anomaly_step"], rollback["clean_step"]) == (20, 10)  # the next comparison
    assert second["resume_step"] == 10 and rollback["resume_step"] == 10
    assert odd not in second["nodes"] and spare in second["nodes"]
    # Written after the last clean comparison: distrusted (CORRUPT) at the rollback; the
    # resumed attempt's own save at 15 later commits afresh.
    assert rollback["distrusted_checkpoints"] == [15]
    assert (run["num_restarts"], run["num_hardware_restarts"]) == (1, 0)  # one of the run's
    assert "sdc:mismatch" in drain_reason(odd, str(slurm_cluster.slurm_conf))
    assert client.get_node(odd)["state"] == "DRAINED"
