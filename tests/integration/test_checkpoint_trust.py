"""Failures that are not a dead node, on the real cluster (issue 15): a corrupted byte in the
newest checkpoint, and a crash that repeats at the same step. Faults come from the worker's
own hooks (worker/faults.py), named per run so no other test's run sees them."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.integration.conftest import Agents, ServiceProcess, ended, inject_faults, tiny_spec

pytestmark = pytest.mark.integration

CORRUPT_RUN, LOOP_RUN = "ck-trust-corrupt", "ck-trust-loop"
# Attempt 1 of CORRUPT_RUN: rank 0 flips a byte of the step-20 checkpoint right after its
# COMMITTED marker (only a load can find that), then dies before committing step 30, so
# attempt 2 resumes from the corrupt 20. Every attempt of LOOP_RUN raises at step 15.
FAULTS = (
    f"corrupt_after_commit:20:0:1@{CORRUPT_RUN}",
    f"before_commit:30:0:1@{CORRUPT_RUN}",
    f"raise_after_step:15:*@{LOOP_RUN}",
)
inject_faults(*FAULTS)


def spec(name: str, **overrides: object) -> dict:
    return tiny_spec(name, steps=30, checkpoint_every=10, keep_checkpoints=2, **overrides)


@pytest.mark.whole_path
@pytest.mark.timeout(240)
def test_a_corrupt_checkpoint_is_skipped_without_wasting_a_restart(
    service: ServiceProcess, agents: Agents
) -> None:
    # `agents`: the nodes heartbeat (this file may be the session's first), else the
    # service declares a training node's heartbeat lost and moves the run.
    client = service.client()
    # max_restarts=1: the crash uses it up, so the run succeeds only if the corrupt load
    # costs nothing.
    run_id = client.submit_run(spec(CORRUPT_RUN, max_restarts=1))["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=200)

    attempts = run["attempts"]
    assert run["state"] == "SUCCEEDED", (run["state_reason"], attempts)
    assert [a["resume_step"] for a in attempts] == [None, 20, 10]
    assert [a["stop_reason"] for a in attempts] == ["job_failed", "checkpoint_corrupt", "completed"]
    assert run["num_restarts"] == 1  # the crash; the corrupt checkpoint cost none
    assert "failed its checksums" in attempts[1]["end_reason"]

    (corrupt,) = [e for e in client.run_events(run_id) if e["kind"] == "checkpoint.corrupt"]
    assert corrupt["attempt_id"] == attempts[1]["id"]
    assert corrupt["data"]["step"] == 20 and corrupt["data"]["found_at"] == "load"
    assert corrupt["data"]["resume_step"] == 10 and "sha256" in corrupt["data"]["detail"]
    incident = next(
        i for i in client.list_incidents() if i["run_id"] == run_id and i["kind"] == "checkpoint"
    )
    assert incident["signal"] == "checkpoint:corrupt" and incident["state"] == "RESOLVED"

    # Attempt 2 verified and refused it; attempt 3 loaded step 10, never 20.
    refused = client.run_logs(run_id, attempt=2)["text"]
    assert "refusing to resume: checkpoint at step 20 is corrupt" in refused
    resumed = client.run_logs(run_id, attempt=3)["text"]
    assert "resumed from" in resumed and "step_00000010 at step 10" in resumed
    assert "step_00000020 at step 20" not in resumed


@pytest.mark.timeout(180)
def test_a_crash_at_the_same_step_stops_after_one_retry(
    service: ServiceProcess, agents: Agents
) -> None:
    client = service.client()
    run_id = client.submit_run(spec(LOOP_RUN, max_restarts=5))["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=150)

    attempts = run["attempts"]
    assert run["state"] == "FAILED"
    assert [a["stop_reason"] for a in attempts] == ["job_failed", "deterministic_failure"]
    assert [a["resume_step"] for a in attempts] == [None, 10]
    assert run["num_restarts"] == 1  # one retry, not max_restarts (5)
    reason = run["state_reason"]
    assert "deterministic failure, the same as attempt 1" in reason
    assert "InjectedFault: injected failure at step 15 (at step 15)" in reason
    assert "stopped after one retry" in reason
