"""A Hugging Face Trainer script and a Lightning script under runyard, each with its one
callback (runyard_client.integrations), stopped by the service as a preemption or a
segment's end stops any run: rank 0 hears the stop in a report's reply, every rank agrees at
the same step, the framework saves its own checkpoint there (Trainer: checkpoint-N,
Lightning: stop-step=N.ckpt) and exits 0, and the next attempt resumes from it: no step
lost, none trained twice. Both scripts run in their owner's own Python. (A cancel scancels
at once: no save through the framework then, issue 39.)"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, wait_for
from tests.integration.conftest import ServiceProcess, committed, tiny_spec

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
    metrics = client.run_metrics(run_id, after_step=max(stop_step - 50, 0), limit=1000)
    before = sorted(m["step"] for m in metrics if m["attempt_id"] == first["id"])
    after = sorted(m["step"] for m in metrics if m["attempt_id"] == second["id"])
    assert before and before[-1] == stop_step  # trained up to the save, not past it
    assert after and after[0] == stop_step + 1  # and on from it
    client.cancel_run(run_id)
