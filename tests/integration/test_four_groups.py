"""Four replica groups of data parallel on the dev cluster, each a Slurm job of one node,
with paced steps (bench/recovery.py --compare's default layout): the fast path must never
be the failure.

- Trained past two SDC comparisons with no fault, no group finds another odd: the groups
  start one timeline together (worker/fault_tolerance.py, a quorum of a strict majority of
  the groups for the first step), so their copies stay bit-equal. Before that rule the
  first group up trained step 1 alone and the others theirs, and the comparison at step 50
  drained a healthy node (issue 37).
- With one bit flipped in one group's parameters, the three others outvote it: only its
  node is drained, its replacement heals from a live group on the spare, and the others
  train on to the end in the attempts they started with, no rollback.
"""

from __future__ import annotations

from typing import Any

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import drain_reason, ended, inject_faults, losses, tiny_spec

pytestmark = pytest.mark.integration

CLEAN_RUN, FLIP_RUN = "four-groups-clean", "four-groups-flip"
# Each step takes at least this long per share of the batch a group trains: a group alone
# trains all four shares (2 s), so the first group up is still busy with its step 1 when the
# others ask the lighthouse for theirs past its 2 s join timeout, as in the bench.
PACE_S = 0.5
SDC_EVERY = 10
# Group 1 (the first attempt numbered 2) flips a bit after step 12: found at step 20.
inject_faults(
    *(f"pace_step:1:*@{name}={PACE_S}" for name in (CLEAN_RUN, FLIP_RUN)),
    f"flip_param:12:0:2@{FLIP_RUN}",
)


def four_groups(name: str, steps: int, max_restarts: int = 0) -> dict[str, Any]:
    return tiny_spec(
        name,
        nodes=4,
        seq_len=128,
        steps=steps,
        checkpoint_every=15,
        keep_checkpoints=10,
        sdc_check_every=SDC_EVERY,
        parallelism="auto",  # dp 4, as the bench's default layout
        fault_tolerance={"replica_groups": 4},
        max_restarts=max_restarts,
    )


def sdc_reports(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    return [
        e["data"]
        for e in client.run_events(run_id, limit=1000)
        if e["kind"] == "worker.error" and (e.get("data") or {}).get("kind") == "worker:sdc"
    ]


@pytest.mark.timeout(300)
def test_four_groups_trained_past_two_comparisons_find_no_corruption(
    spare_pool: RunyardClient,
) -> None:
    client = spare_pool
    run_id = client.submit_run(four_groups(CLEAN_RUN, steps=2 * SDC_EVERY + 5))["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=240)

    assert run["state"] == "SUCCEEDED", (run["state_reason"], run["attempts"])
    assert sdc_reports(client, run_id) == []
    # One attempt per group, none restarted, no node drained, nothing rolled back.
    assert sorted(a["replica_group"] for a in run["attempts"]) == [0, 1, 2, 3]
    assert {a["stop_reason"] for a in run["attempts"]} == {"completed"}
    assert run["rollbacks"] == [] and run["num_restarts"] == 0
    assert not [n["name"] for n in client.list_nodes() if n["state"] in ("DRAINED", "DRAINING")]


# In make test-all (CI) with the clean run above: it proves no false verdict (one report, for
# the flipped group alone; only its node drained). make test's whole paths hold the fast path
# (test_fast_recovery: a group loses its node, the other trains on) and the flipped bit
# (test_sdc) each once; four groups of paced steps took 58 s of its ten minutes.
@pytest.mark.timeout(360)
def test_a_bit_flipped_in_one_of_four_groups_drains_only_its_node_and_the_others_train_on(
    spare_pool: RunyardClient,
    slurm_cluster,  # type: ignore[no-untyped-def]
) -> None:
    client = spare_pool
    spare = client.get_spares()["members"][0]
    run_id = client.submit_run(four_groups(FLIP_RUN, steps=90, max_restarts=1))["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=300)

    assert run["state"] == "SUCCEEDED", (run["state_reason"], run["attempts"])
    first = {a["replica_group"]: a for a in run["attempts"] if a["number"] <= 4}
    odd = first[1]["nodes"][0]
    [report] = sdc_reports(client, run_id)  # group 1 alone: the others were in the majority
    assert report["step"] == 2 * SDC_EVERY and report["nodes"] == [odd] and report["outvoted"]
    assert first[1]["stop_reason"] == "sdc"
    # The majority trained on in the attempts they started with, to the last step.
    for group in (0, 2, 3):
        assert first[group]["stop_reason"] == "completed", first[group]
        assert max(losses(client, run_id, first[group]["id"])) == 90
    # Group 1's replacement on the spare healed from them: no rollback, no disk resume.
    [replacement] = [a for a in run["attempts"] if a["number"] > 4]
    assert replacement["replica_group"] == 1 and replacement["nodes"] == [spare]
    assert replacement["resume_step"] is None and replacement["stop_reason"] == "completed"
    assert run["rollbacks"] == []
    # The verdict is the run's own claim: one of its max_restarts (recovery/claims.py).
    assert (run["num_restarts"], run["num_hardware_restarts"]) == (1, 0)
    # Only the odd node drained, for SDC.
    drained = [n["name"] for n in client.list_nodes() if n["state"] in ("DRAINED", "DRAINING")]
    assert drained == [odd]
    assert "sdc:mismatch" in drain_reason(odd, str(slurm_cluster.slurm_conf))
