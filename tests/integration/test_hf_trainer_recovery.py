"""A transformers.Trainer script survives a GPU failure under runyard with one callback: the
example (examples/hf_trainer.py: a tiny Llama, DDP over gloo, checkpoint-N folders every 20
steps, runyard_client.integrations.hf.RunyardCallback) runs on two nodes of the dev cluster,
one node logs Xid 79, the node is drained, a spare takes its place and the Trainer resumes
from the newest checkpoint-N it wrote and the callback committed. The steps trained twice
have the same losses, `run watch` shows the steps and losses the callback reported, and
goodput accounts for the whole run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from client.api import RunyardClient
from client.cli import app
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    lose_a_node_and_resume,
    tiny_spec,
)

pytestmark = [pytest.mark.integration, pytest.mark.whole_path]

REPO_ROOT = Path(__file__).resolve().parents[2]
STEPS, SAVE_STEPS = 120, 20
# About 0.1 s a step at this shape with one thread a rank: the failure (3 steps past the
# first commit, step 20) is detected and the node drained within ten or so steps, well
# before the last, and the steps trained twice (after the resume point, before the loss)
# are there to compare. (The script's default 64 x 8 trains 60 steps a second: the first
# attempt reached its third commit, step 60, before it was stopped, on 2026-12-07.)
ARGS = ["--save-steps", str(SAVE_STEPS), "--seq-len", "256", "--batch-size", "16"]


def watch(service: ServiceProcess, run_id: int) -> tuple[int, str]:
    """`runyard run watch` into a pipe: a progress line whenever the step moved."""
    env = {"RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token}
    result = CliRunner().invoke(
        app, ["run", "watch", str(run_id), "--interval-s", "1", "--timeout-s", "420"], env=env
    )
    return result.exit_code, result.output


@pytest.mark.timeout(600)
def test_a_trainer_script_resumes_on_a_spare_from_its_newest_checkpoint(
    service: ServiceProcess,
    spare_pool: RunyardClient,
    agents: Agents,
    slurm_cluster,  # type: ignore[no-untyped-def]
    owner_python: Path,
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    script = str(REPO_ROOT / "examples" / "hf_trainer.py")
    # The script runs in its owner's own Python (conftest.owners_python: not runyard's
    # environment; runyard-client installed there), which the service checked as ops.
    spec = tiny_spec(
        "hf-trainer-xid",
        steps=STEPS,
        entrypoint={"script": script, "args": ARGS},
        environment={"python": str(owner_python)},
    )
    run_id = client.submit_run(spec)["id"]
    moved = lose_a_node_and_resume(client, run_id, agents, conf, commit_timeout_s=180)
    resume_step = moved.resume_step
    assert resume_step % SAVE_STEPS == 0  # the Trainer's cadence
    (resumed,) = [c for c in client.run_checkpoints(run_id) if c["step"] == resume_step]
    assert Path(resumed["path"]).name == f"checkpoint-{resume_step}"  # the Trainer's own folder

    # `run watch` until the end: the steps and losses the callback reported, rising to the last.
    code, out = watch(service, run_id)
    assert code == 0 and f"run {run_id} SUCCEEDED" in out, out[-3000:]
    shown = [int(s) for s in re.findall(rf"step +(\d+)/{STEPS}  loss \d+\.\d{{4}} ", out)]
    # Steps rise to the last; the ones trained again after the resume show once more.
    assert shown and shown[-1] == max(shown) == STEPS, out[-3000:]

    final = client.get_run(run_id)
    assert final["num_hardware_restarts"] == 1 and final["last_step"] == STEPS
    log = client.run_logs(run_id, attempt=2, rank=0)["text"]
    assert f"resuming from {resumed['path']}" in log, log[-2000:]

    # The steps after the checkpoint were trained by both attempts: the same losses. 1e-4
    # relative: the Trainer restores the weights, AdamW's moments, the schedule, the RNG and
    # the data order exactly, and two ranks' gloo all-reduce adds two numbers (the same sum
    # in any order), so the dev cluster, whose nodes share one CPU, repeats the arithmetic
    # bit for bit; the margin is for a spare whose task gets another number of CPUs (its
    # BLAS then sums in another order: ulps, grown over a few steps). A resume from another
    # step, or with the data out of order, is off by more than 1e-2.
    attempts = [a["id"] for a in final["attempts"]]
    rows = client.run_metrics(run_id, after_step=resume_step, limit=10_000)
    before = {m["step"]: m["loss"] for m in rows if m["attempt_id"] == attempts[0]}
    after = {m["step"]: m["loss"] for m in rows if m["attempt_id"] == attempts[1]}
    assert min(after) == resume_step + 1  # the Trainer went on from the checkpoint's step
    twice = sorted(before.keys() & after.keys())
    assert twice, (sorted(before)[-3:], sorted(after)[:3])
    for step in twice:
        assert after[step] == pytest.approx(before[step], rel=1e-4), step

    # The Xid's cost, each part where it belongs; the rest was productive.
    goodput = final["goodput"]
    lost = goodput["lost"]
    assert 0 < goodput["goodput"] < 1, goodput
    assert lost["recomputed_steps_s"] + lost["detection_s"] > 0, lost
    assert lost["drain_and_resubmit_s"] > 0 and lost["startup_and_load_s"] > 0, lost
    assert goodput["productive_s"] == pytest.approx(
        goodput["allocated_s"] - sum(lost.values()), abs=0.01
    ), goodput
