"""A Lightning script under runyard with one callback (examples/lightning_train.py: a tiny
Llama, DDP on CPUs through TorchElasticEnvironment, ModelCheckpoint every 20 steps,
runyard_client.integrations.lightning.RunyardCallback): a GPU failure moves it to a spare,
where Lightning resumes from the newest .ckpt the callback committed with the same losses.
(Stops, a segment's end and a cancel: tests/integration/test_framework_stops.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    lose_a_node_and_resume,
    tiny_spec,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO_ROOT / "examples" / "lightning_train.py")
STEPS, SAVE_STEPS = 300, 20
# About 0.1 s a step at one thread a rank (0.55 s at two, before the launcher set
# OMP_NUM_THREADS as torchrun does): the failure (past the first commit, step 20) lands long
# before the last step, and the run stays short.
SIZE = ["--seq-len", "256", "--batch-size", "16"]


@pytest.mark.timeout(1020)
def test_a_lightning_script_resumes_on_a_spare_from_its_newest_checkpoint(
    spare_pool: RunyardClient,
    agents: Agents,
    slurm_cluster,  # type: ignore[no-untyped-def]
    owner_python: Path,
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    args = ["--save-steps", str(SAVE_STEPS), *SIZE]
    spec = tiny_spec(
        "lightning-xid",
        steps=STEPS,
        entrypoint={"script": SCRIPT, "args": args},
        environment={"python": str(owner_python)},  # its owner's own Python
    )
    run_id = client.submit_run(spec)["id"]
    moved = lose_a_node_and_resume(client, run_id, agents, conf, commit_timeout_s=180)
    resume_step = moved.resume_step
    assert resume_step % SAVE_STEPS == 0
    (resumed,) = [c for c in client.run_checkpoints(run_id) if c["step"] == resume_step]
    assert Path(resumed["path"]).name == f"epoch=0-step={resume_step}.ckpt"  # ModelCheckpoint's

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=840
    )
    final = client.get_run(run_id)
    assert final["num_hardware_restarts"] == 1 and final["last_step"] == STEPS
    log = client.run_logs(run_id, attempt=2, rank=0)["text"]
    assert f"resuming from {resumed['path']}" in log, log[-2000:]

    # Steps trained by both attempts: the same losses, 1e-4 relative (as in
    # test_hf_trainer_recovery: weights, AdamW's moments and the schedule restored exactly,
    # the batches a function of the step, two ranks' all-reduce order-free; the margin for a
    # spare whose BLAS sums in another order).
    attempts = [a["id"] for a in final["attempts"]]
    rows = client.run_metrics(run_id, after_step=resume_step, limit=10_000)
    before = {m["step"]: m["loss"] for m in rows if m["attempt_id"] == attempts[0]}
    after = {m["step"]: m["loss"] for m in rows if m["attempt_id"] == attempts[1]}
    assert min(after) == resume_step + 1  # Lightning's global step went on from the checkpoint's
    twice = sorted(before.keys() & after.keys())
    assert twice, (sorted(before)[-3:], sorted(after)[:3])
    for step in twice:
        assert after[step] == pytest.approx(before[step], rel=1e-4), step
    goodput = final["goodput"]
    assert 0 < goodput["goodput"] < 1 and goodput["lost"]["drain_and_resubmit_s"] > 0, goodput
