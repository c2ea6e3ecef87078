"""Two gloo ranks, for real: a crash mid-checkpoint, then a resume that retraces the curve.

Run A trains 12 steps under torchrun, uninterrupted. Run B is launched the way Slurm
launches tasks (SLURM_* variables, rendezvous on a TCPStore) and its rank 0 is SIGKILLed at
step 10 after every rank wrote its checkpoint files but before the COMMITTED marker (the
save is asynchronous, so rank 0 may have trained a step or two more). Run C
resumes B with --resume: it must pick step 5 (step 10 is not committed) and reproduce A's
losses for steps 6..12. Run D resumes A's step 10 on a single rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from worker_helpers import clean_env, free_port, tiny_spec

from contract import WorkerRunConfig
from worker.checkpoint import MARKER, latest_committed
from worker.launch import read_launch_env
from worker.reporter import FileReporter
from worker.train import train

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

NUM_RANKS = 2


def train_args(spec: Path, checkpoint_dir: Path, metrics: Path, *extra: str) -> list[str]:
    return [
        "-m",
        "worker.train",
        "--spec",
        str(spec),
        "--checkpoint-dir",
        str(checkpoint_dir),
        "--metrics-file",
        str(metrics),
        *extra,
    ]


def start_slurm_tasks(args: list[str], job_id: int, **extra_env: str) -> list[subprocess.Popen]:
    """Start NUM_RANKS tasks with the environment srun gives them on node gpu001."""
    port = str(free_port())
    procs = []
    for rank in range(NUM_RANKS):
        env = clean_env(
            SLURM_JOB_ID=str(job_id),
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_NTASKS=str(NUM_RANKS),
            SLURM_JOB_NODELIST="gpu001",
            SLURMD_NODENAME="gpu001",
            RUNYARD_MASTER_ADDR="127.0.0.1",  # no slurmctld here to answer `scontrol show node`
            RUNYARD_MASTER_PORT=port,
            **extra_env,
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    return procs


def losses(metrics: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "metric"}


def committed_steps(checkpoint_dir: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in checkpoint_dir.glob("step_*") if (p / MARKER).exists())


@pytest.mark.timeout(180)
def test_crash_then_resume_reproduces_the_uninterrupted_losses(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    # dp 2 x micro batch 2 x 2 accumulation steps = 8 sequences per step.
    spec = tiny_spec(
        tmp_path / "unused",
        data_cache_dir,
        layout={"dp": NUM_RANKS, "micro_batch_size": 2},
        steps=12,
        checkpoint_every=5,
        keep_checkpoints=2,
    )
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec))

    # A: uninterrupted, under torchrun.
    dir_a, metrics_a = tmp_path / "a", tmp_path / "a.jsonl"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    run_a = subprocess.run(
        [*torchrun, f"--nproc-per-node={NUM_RANKS}", *train_args(spec_path, dir_a, metrics_a)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run_a.returncode == 0, run_a.stdout + run_a.stderr
    expected = losses(metrics_a)
    assert sorted(expected) == list(range(1, 13))
    assert committed_steps(dir_a) == [10, 12]  # 5 pruned: keep_checkpoints=2

    # B: Slurm-style tasks; rank 0 dies at step 10 between the DCP files and the marker.
    dir_b, metrics_b = tmp_path / "b", tmp_path / "b.jsonl"
    rank0, rank1 = start_slurm_tasks(
        train_args(spec_path, dir_b, metrics_b), job_id=101, RUNYARD_FAULT="before_commit:10"
    )
    out0, _ = rank0.communicate(timeout=120)
    rank1.kill()  # what `srun --kill-on-bad-exit` does to the surviving task
    rank1.communicate()
    assert rank0.returncode == -9, out0
    assert "killing rank 0 at before_commit of step 10" in out0
    assert (dir_b / "step_00000010").is_dir() and not (dir_b / "step_00000010" / MARKER).exists()
    resume_point = latest_committed(dir_b)
    assert resume_point is not None and resume_point.step == 5
    before_crash = losses(metrics_b)
    # The save is asynchronous: rank 0 finds it complete (and dies committing it) at the end
    # of step 10 or, while the write still runs, a later step (12 at the latest: the last
    # step waits for it before saving its own).
    assert sorted(before_crash) == list(range(1, len(before_crash) + 1))
    assert 10 <= len(before_crash) <= 12
    for step, loss in before_crash.items():  # a Slurm launch trains exactly as torchrun does
        assert loss == pytest.approx(expected[step], abs=1e-5), step

    # C: the next attempt on the same folder, resuming from the newest committed step.
    metrics_c = tmp_path / "c.jsonl"
    tasks = start_slurm_tasks(train_args(spec_path, dir_b, metrics_c, "--resume"), job_id=102)
    outputs = [task.communicate(timeout=120)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[0] + outputs[1]
    assert f"resumed from {resume_point.path} at step 5" in outputs[0]
    resumed = losses(metrics_c)
    assert sorted(resumed) == list(range(6, 13))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], abs=1e-5), step
    assert committed_steps(dir_b) == [10, 12]  # step 10 rewritten and committed, 5 pruned

    # D: A's step 10 resumed on one rank (dp 1, 4 sequences x 2 micro steps): DCP reshards
    # model and optimizer, and the data order does not depend on dp, so the curve holds.
    one_rank = WorkerRunConfig.model_validate(
        spec
        | {
            "layout": {"dp": 1, "micro_batch_size": 4},
            "checkpoint_dir": str(tmp_path / "d"),
            "resume_from": {"step": 10, "path": str(dir_a / "step_00000010")},
        }
    )
    metrics_d = tmp_path / "d.jsonl"
    train(one_rank, read_launch_env({}), FileReporter(metrics_d))
    for step, loss in losses(metrics_d).items():
        assert loss == pytest.approx(expected[step], abs=1e-4), step
