"""The examples on two ranks (DDP over gloo, one process per "node" as runyard's launcher
starts them: RANK, WORLD_SIZE, LOCAL_RANK=0, MASTER_*): Slurm's time-limit signal reaches
rank 1 only, which does not hear the service either; the callbacks' all-reduce makes
rank 0 stop at the same step, so both save through the framework and exit 0 instead of
one waiting forever in the other's next collective."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from callback_helpers import REPO_ROOT, losses, rows
from worker_helpers import clean_env, free_port

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

EXAMPLES = {
    "hf": (REPO_ROOT / "examples" / "hf_trainer.py", "checkpoint-{step}"),
    "lightning": (REPO_ROOT / "examples" / "lightning_train.py", "stop-step={step}.ckpt"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_a_signal_on_one_rank_stops_both_at_the_same_step(example: str, tmp_path: Path) -> None:
    script, checkpoint_name = EXAMPLES[example]
    metrics = tmp_path / "metrics.jsonl"
    env = clean_env(
        WORLD_SIZE="2",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        RUNYARD_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
        RUNYARD_METRICS_FILE=str(metrics),
    )
    # 200 steps of ~20 ms: the signal comes long before the end. A save at step 1000 only.
    argv = [sys.executable, str(script), "--steps", "200", "--save-steps", "1000",
            "--batch-size", "4", "--seq-len", "32"]  # fmt: skip
    ranks = [
        subprocess.Popen(argv, env=env | {"RANK": str(rank)}, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in range(2)
    ]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (metrics.exists() and max(losses(metrics), default=0) >= 3):
            assert time.monotonic() < deadline, "rank 0 reported no step 3 in 120 s"
            assert all(rank.poll() is None for rank in ranks), "a rank exited early"
            time.sleep(0.05)
        ranks[1].send_signal(signal.SIGUSR2)
        outputs = [rank.communicate(timeout=120)[0] for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    assert [rank.returncode for rank in ranks] == [0, 0], "\n".join(o[-3000:] for o in outputs)

    (commit,) = rows(metrics, "checkpoint")
    stop_step = max(losses(metrics))
    assert 3 <= commit["step"] == stop_step < 200  # saved where both stopped
    assert Path(commit["path"]).name == checkpoint_name.format(step=stop_step)
    assert rows(metrics, "finish") == []
