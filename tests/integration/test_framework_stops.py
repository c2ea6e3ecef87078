"""A Hugging Face Trainer script and a Lightning script under runyard, each with its one
callback (runyard_client.integrations), stopped by the service as a preemption, a segment's
end or a cancel stops any run: rank 0 hears the stop in a report's reply, every rank agrees
at the same step, the framework saves its own checkpoint there (Trainer: checkpoint-N,
Lightning: stop-step=N.ckpt) and exits 0, and the next attempt resumes from it: no step
lost, none trained twice. A cancel ends the run, so its save is the one a later run would
start from. Both scripts run in their owner's own Python."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from client.api import RunyardClient
from tests.conftest import REPO_ROOT, TEST_DATABASE, wait_for
from tests.integration.conftest import ServiceProcess, committed, other_work, slurm, tiny_spec

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Framework:
    script: str
    stop_checkpoint: str  # the name of the framework's save at a stop, {step} filled in


FRAMEWORKS = {
    "trainer": Framework(str(REPO_ROOT / "examples" / "hf_trainer.py"), "checkpoint-{step}"),
    "lightning": Framework(
        str(REPO_ROOT / "examples" / "lightning_train.py"), "stop-step={step}.ckpt"
    ),
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_stop_saves_through_the_framework_and_the_next_attempt_resumes_there(
    service: ServiceProcess, owner_python: Path, name: str
) -> None:
    framework = FRAMEWORKS[name]
    client = service.client()
    # No checkpoint of the framework's own cadence: the stops' saves are the only ones.
    args = ["--save-steps", "100000", "--seq-len", "32", "--batch-size", "4"]
    spec = tiny_spec(
        f"{name}-stops",
        steps=100000,
        time_limit_min=1,  # stopped before the end of each 1-minute segment
        entrypoint={"script": framework.script, "args": args},
        environment={"python": str(owner_python)},
    )
    run_id = client.submit_run(spec)["id"]
    second = wait_for(
        "the second attempt training",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][1:] if a["first_step"] is not None),
            None,
        ),
        timeout_s=300,
    )
    first = client.get_run(run_id)["attempts"][0]
    assert first["state"] == "STOPPED" and first["stop_reason"] == "time_limit", first
    stop_step = second["resume_step"]
    assert stop_step > 0 and committed(client, run_id)[0] == stop_step  # the stop's own save
    (saved,) = [c for c in client.run_checkpoints(run_id) if c["step"] == stop_step]
    assert Path(saved["path"]).name == framework.stop_checkpoint.format(step=stop_step)
    metrics = client.run_metrics(run_id, after_step=max(stop_step - 50, 0), limit=10_000)
    before = sorted(m["step"] for m in metrics if m["attempt_id"] == first["id"])
    after = sorted(m["step"] for m in metrics if m["attempt_id"] == second["id"])
    assert before and before[-1] == stop_step  # trained up to the save, not past it
    assert after and after[0] == stop_step + 1  # and on from it
    client.cancel_run(run_id, now=True)  # its cancel's save is the other test's


def jobs_of_tests(conf: str) -> list[str]:
    """The names of the queued jobs this test session's service submitted."""
    names = slurm("squeue", "-h", "-o", "%j", conf=conf).split()
    return [n for n in names if n.startswith(f"runyard-{TEST_DATABASE}-")]


def trained_by(client: RunyardClient, run_id: int, attempt_id: int, after: int) -> list[int]:
    metrics = client.run_metrics(run_id, after_step=after, limit=10_000)
    return sorted(m["step"] for m in metrics if m["attempt_id"] == attempt_id)


def saved_at(client: RunyardClient, run_id: int, step: int) -> Path:
    (saved,) = [c for c in client.run_checkpoints(run_id) if c["step"] == step]
    assert saved["state"] == "COMMITTED", saved
    return Path(saved["path"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_a_preemption_and_a_cancel_each_save_through_the_framework(
    service: ServiceProcess, owner_python: Path, slurm_cluster, name: str
) -> None:
    """A scavenger run of the framework's script yields its nodes to a prod run, saving
    through its framework; it resumes there once the prod run is done, and the user's
    cancel then stops it with one more save of the framework's own."""
    framework, client = FRAMEWORKS[name], service.client()
    conf = str(slurm_cluster.slurm_conf)
    client.set_spares(0)
    args = ["--save-steps", "100000", "--seq-len", "32", "--batch-size", "4"]
    spec = tiny_spec(
        f"{name}-yields",
        steps=100000,
        priority="scavenger",
        entrypoint={"script": framework.script, "args": args},
        environment={"python": str(owner_python)},
    )
    # Other work holds every node but two: the scavenger takes both, the prod run needs them
    # (counted once the jobs of the tests before have left).
    wait_for(
        "the earlier tests' jobs to leave",
        lambda: not jobs_of_tests(conf),
        timeout_s=120,
    )
    with other_work(conf, leave_idle=2):
        run_id = client.submit_run(spec)["id"]
        wait_for(
            "the scavenger training",
            lambda: (client.get_run(run_id)["last_step"] or 0) >= 5,
            timeout_s=240,
        )
        free = slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", conf=conf).split()
        assert free == [], f"{free} idle: the prod run would not need to preempt"
        prod = client.submit_run(tiny_spec(f"{name}-prod", steps=20, priority="prod"))["id"]
        first = wait_for(
            "the scavenger to yield",
            lambda: next(
                (a for a in client.get_run(run_id)["attempts"] if a["state"] == "STOPPED"), None
            ),
            timeout_s=120,
            context=lambda: (
                f"events: {[e['message'] for e in client.run_events(run_id)]}; "
                f"prod: {[e['message'] for e in client.run_events(prod)]}"
            ),
        )
        assert (first["stop_reason"], first["stopped_for_run_id"]) == ("preempted", prod)
        wait_for(
            "the prod run to succeed",
            lambda: client.get_run(prod)["state"] == "SUCCEEDED",
            timeout_s=180,
        )
    yielded = committed(client, run_id)[-1]
    assert saved_at(client, run_id, yielded).name == framework.stop_checkpoint.format(step=yielded)
    assert trained_by(client, run_id, first["id"], 0)[-1] == yielded  # not a step past it

    second = wait_for(
        "the scavenger training again",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][1:] if a["first_step"] is not None),
            None,
        ),
        timeout_s=240,
    )
    assert second["resume_step"] == yielded
    wait_for(
        "steps past the resume point",
        lambda: len(trained_by(client, run_id, second["id"], yielded)) >= 3,
    )
    assert trained_by(client, run_id, second["id"], yielded)[0] == yielded + 1

    assert client.cancel_run(run_id)["state"] == "CANCELLING"
    wait_for("the run cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED",
             timeout_s=120)  # fmt: skip
    ended = client.get_run(run_id)
    last = ended["attempts"][-1]
    assert last["id"] == second["id"] and last["stop_reason"] == "cancelled", last
    assert last["end_reason"] == "cancelled by the user (saved and exited)", last
    final = committed(client, run_id)[-1]
    after_resume = trained_by(client, run_id, second["id"], yielded)
    assert final > yielded and after_resume[-1] == final, (final, after_resume[-3:])
    assert saved_at(client, run_id, final).name == framework.stop_checkpoint.format(step=final)
    assert f"newest checkpoint is step {final}" in ended["state_reason"]
    kinds = [e["data"].get("reason") for e in client.run_events(run_id)
             if e["kind"] == "attempt.stop_requested"]  # fmt: skip
    assert kinds == ["preempted", "cancelled"], kinds
