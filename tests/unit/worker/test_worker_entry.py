"""entry.run_attempt: importable without torch, and a whole attempt against the service API."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from worker_helpers import REPO_ROOT, FakeService, clean_env, free_port, tiny_spec

from contract import ExitCode
from worker.entry import run_attempt


def test_importing_entry_does_not_import_torch() -> None:
    """The service pickles run_attempt by reference and never installs torch."""
    code = "import sys, worker.entry; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert pickle.loads(pickle.dumps(run_attempt)) is run_attempt


def one_task_variables() -> dict[str, str]:
    """What Slurm (and runyard's batch script) gives task 0 of a one-task job on gpu001."""
    return {
        "SLURM_JOB_ID": "77",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": "gpu001",
        "SLURMD_NODENAME": "gpu001",
        "RUNYARD_MASTER_ADDR": "127.0.0.1",
        "RUNYARD_MASTER_PORT": str(free_port()),
    }


@pytest.fixture
def one_slurm_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as task 0 of a one-task Slurm job on gpu001."""
    for name, value in one_task_variables().items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_an_attempt_reports_every_step_its_checkpoints_and_the_finish(
    fake_service: FakeService, one_slurm_task: None, tmp_path: Path, data_cache_dir: Path
) -> None:
    fake_service.config = tiny_spec(tmp_path / "ckpt", data_cache_dir, attempt_id=9, steps=7)
    run_attempt(fake_service.url, 9)

    metrics = [m for body in fake_service.bodies("/progress") for m in body["metrics"]]
    assert [m["step"] for m in metrics] == list(range(1, 8))
    assert {body["node"] for body in fake_service.bodies("/progress")} == {"gpu001"}
    registrations = fake_service.bodies("/checkpoints")
    assert [(c["step"], c["state"]) for c in registrations] == [
        (5, "WRITING"),
        (5, "COMMITTED"),
        (7, "WRITING"),
        (7, "COMMITTED"),
    ]
    committed = registrations[-1]
    assert committed["path"] == str((tmp_path / "ckpt" / "step_00000007").resolve())
    assert committed["num_bytes"] > 0 and committed["write_s"] > 0
    assert fake_service.bodies("/finish") == [{"final_step": 7, "final_checkpoint_step": 7}]


def test_an_unsupported_layout_exits_do_not_retry(
    fake_service: FakeService, one_slurm_task: None, tmp_path: Path, capsys
) -> None:
    # fp8 on a machine without an FP8 GPU: refused before any collective, never retried.
    fake_service.config = tiny_spec(tmp_path, tmp_path, attempt_id=9, layout={"precision": "fp8"})
    with pytest.raises(SystemExit) as exited:
        run_attempt(fake_service.url, 9)
    assert exited.value.code == ExitCode.DO_NOT_RETRY
    assert "precision=fp8 needs an NVIDIA GPU with FP8 tensor cores" in capsys.readouterr().err


def test_the_launcher_of_a_users_script_does_not_import_torch(
    fake_service: FakeService, tmp_path: Path
) -> None:
    """A user's script imports its own torch, in its own process: its launcher only hands it
    its place and watches it, and paid torch's import beside it (4 CPU-s a rank on the dev
    cluster's cores, at every attempt) for nothing. The script reads its parent's mappings."""
    script = tmp_path / "train.py"
    found = tmp_path / "parent_maps_torch.txt"
    script.write_text(
        "import os, pathlib\n"
        "maps = pathlib.Path(f'/proc/{os.getppid()}/maps').read_text()\n"
        f"pathlib.Path({str(found)!r}).write_text(str('libtorch' in maps))\n"
    )
    spec = tiny_spec(tmp_path / "ckpt", tmp_path / "cache", attempt_id=9, steps=3)
    fake_service.config = spec | {"entrypoint": {"script": str(script)}}
    launcher = subprocess.run(
        [sys.executable, "-m", "worker.entry", "--service-url", fake_service.url,
         "--attempt-id", "9"],
        env=clean_env(PYTHONPATH=str(REPO_ROOT), **one_task_variables()),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert launcher.returncode == 0, launcher.stderr[-3000:]
    assert found.read_text() == "False", "the launcher had torch loaded beside the script"
