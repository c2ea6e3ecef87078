"""What Slurm runs as root on a node (issue 38, finding 6d and 6e): the prolog, epilog and
health check read agent.env as data, never as a script, and only from a file and folder
root owns that nobody else may write; the health check keeps its place in the kernel log in
a folder of root's own and never writes through a link; `runyard doctor` names a hook file
someone else may write. The scripts run here as Slurm runs them (as root, on this checkout's
virtualenv, against a temporary agent.env)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.doctor.hooks import check_hook_files
from tests.conftest import REPO_ROOT
from worker.agent import healthcheck
from worker.agent.outbox import Outbox

DEPLOY = REPO_ROOT / "deploy"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root")


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("marker*"))


def agent_env(site: Path, *lines: str) -> Path:
    """An agent.env in a folder of its own (root's, 0755), as /etc/runyard holds it."""
    folder = site / "etc"
    folder.mkdir(mode=0o755, exist_ok=True)
    path = folder / "agent.env"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def a_site(tmp_path: Path) -> Path:
    """RUNYARD_HOME with this checkout's virtualenv as its venv, as deploy/ expects it."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "venv").symlink_to(Path(sys.prefix))
    return home


def attacks(site: Path) -> list[str]:
    """Lines that run `touch` if the file is sourced (in a value too)."""
    return [
        f"touch {site}/marker-line",
        f"RUNYARD_EXPECT_GPUS=$(touch {site}/marker-substitution)",
        f"RUNYARD_UNKNOWN=`touch {site}/marker-backquote`",
        f"RUNYARD_KERNEL_LOG={site}/kern.log; touch {site}/marker-semicolon",
    ]


def read_agent_env(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """deploy/agent-env.sh's reader in a fresh sh, printing what it exported."""
    script = f'. {DEPLOY / "agent-env.sh"}; read_agent_env "$1" && env | grep ^RUNYARD_ | sort'
    clean = {"PATH": os.environ["PATH"]}
    return subprocess.run(
        ["sh", "-c", script, "sh", str(path)], capture_output=True, text=True, cwd=cwd, env=clean
    )


def run_hook(script: str, env_file: Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "RUNYARD_AGENT_ENV": str(env_file), **extra}
    return subprocess.run(
        [str(DEPLOY / script)], capture_output=True, text=True, cwd=cwd, env=env, timeout=60
    )


def test_agent_env_is_read_as_data_never_run(tmp_path: Path) -> None:
    path = agent_env(
        tmp_path, "RUNYARD_NODE=gpu001", 'RUNYARD_HOME="/opt/run yard"', *attacks(tmp_path)
    )
    done = read_agent_env(path, tmp_path)
    print(done.stdout, done.stderr)
    assert done.returncode == 0 and markers(tmp_path) == []
    assert done.stdout.splitlines() == [
        f"RUNYARD_EXPECT_GPUS=$(touch {tmp_path}/marker-substitution)",
        "RUNYARD_HOME=/opt/run yard",
        f"RUNYARD_KERNEL_LOG={tmp_path}/kern.log; touch {tmp_path}/marker-semicolon",
        "RUNYARD_NODE=gpu001",
    ]


def test_the_prolog_queues_its_event_without_running_agent_env(tmp_path: Path) -> None:
    home = a_site(tmp_path)
    path = agent_env(
        tmp_path,
        f"RUNYARD_HOME={home}",
        "RUNYARD_NODE=gpu001",
        f"RUNYARD_AGENT_STATE_ROOT={tmp_path / 'agent'}",
        *attacks(tmp_path),
    )
    done = run_hook("slurm-prolog.sh", path, tmp_path, SLURM_JOB_ID="42", SLURM_JOB_NAME="x")
    print(done.stdout, done.stderr)
    assert done.returncode == 0 and markers(tmp_path) == []
    [(_, event)] = Outbox(tmp_path / "agent" / "gpu001" / "outbox.sqlite").peek(10)
    assert event["idempotency_key"] == "gpu001:slurm:42:prolog"


def test_the_health_check_runs_without_running_agent_env(tmp_path: Path) -> None:
    home = a_site(tmp_path)
    (tmp_path / "kern.log").write_text(f"boot\n{XID_79}\n")
    path = agent_env(
        tmp_path,
        f"RUNYARD_HOME={home}",
        "RUNYARD_NODE=gpu001",
        f"RUNYARD_KERNEL_LOG={tmp_path / 'kern.log'}",
        f"RUNYARD_HEALTHCHECK_STATE_ROOT={tmp_path / 'healthcheck'}",
        *attacks(tmp_path)[:1],
        f"OTHER=`touch {tmp_path}/marker-backquote`",
    )
    # --dry-run is not a script option: PATH's scontrol is a stub that only says no.
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "scontrol").write_text("#!/bin/sh\necho 'not here' >&2; exit 1\n")
    (stub / "scontrol").chmod(0o755)
    done = run_hook("runyard-healthcheck.sh", path, tmp_path, PATH=f"{stub}:{os.environ['PATH']}")
    print(done.stdout, done.stderr)
    assert markers(tmp_path) == []
    assert done.returncode == 1 and "xid 79 on PCI:0000:3b:00" in done.stderr
    assert (tmp_path / "healthcheck" / "gpu001" / healthcheck.POSITION_FILE).is_file()


@pytest.mark.parametrize(
    "spoil",
    [
        pytest.param(lambda p: p.chmod(0o666), id="file-writable-by-everyone"),
        pytest.param(lambda p: p.chmod(0o620), id="file-writable-by-its-group"),
        pytest.param(lambda p: os.chown(p, NOBODY, -1), id="file-not-roots"),
        pytest.param(lambda p: p.parent.chmod(0o775), id="folder-writable-by-its-group"),
        pytest.param(lambda p: os.chown(p.parent, NOBODY, -1), id="folder-not-roots"),
    ],
)
def test_an_agent_env_someone_else_may_write_is_refused(tmp_path: Path, spoil: object) -> None:
    home = a_site(tmp_path)
    path = agent_env(
        tmp_path,
        f"RUNYARD_HOME={home}",
        "RUNYARD_NODE=gpu001",
        f"RUNYARD_AGENT_STATE_ROOT={tmp_path / 'agent'}",
    )
    spoil(path)  # type: ignore[operator]
    read = read_agent_env(path, tmp_path)
    assert read.returncode == 1 and read.stdout == ""
    assert f"{path} not read" in " ".join(read.stderr.split()), read.stderr
    done = run_hook("slurm-prolog.sh", path, tmp_path, SLURM_JOB_ID="42")
    print(done.stderr)
    assert done.returncode == 0, "a prolog never fails the job"
    assert "event not queued" in done.stderr
    assert not (tmp_path / "agent").exists(), "nothing ran with the refused file's settings"


def test_an_agent_env_that_is_a_link_is_refused(tmp_path: Path) -> None:
    real = agent_env(tmp_path, "RUNYARD_NODE=gpu001")
    link = real.parent / "linked.env"
    link.symlink_to(real)
    done = read_agent_env(link, tmp_path)
    assert done.returncode == 1 and "not a regular file" in done.stderr


def test_the_position_is_never_written_through_a_link(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "state"
    log.write_text(f"boot\n{XID_79}\n")
    victim = tmp_path / "root-owned.json"  # any file root may write: /etc/..., a unit
    victim.write_text("{}\n")
    state.mkdir(mode=0o700)
    position = state / healthcheck.POSITION_FILE

    # The position itself a link (planted while the folder was the agent's): refused,
    # nothing read through it or written to it.
    position.symlink_to(victim)
    refused = None
    try:
        healthcheck.kernel_problems(log, state)
    except healthcheck.UnsafeStateDir as exc:
        refused = str(exc)
    assert victim.read_text() == "{}\n", "root wrote through the link"
    assert refused is not None and "link" in refused

    # The temporary name the check writes first, planted as a link: replaced, not followed.
    position.unlink()
    (state / f".{healthcheck.POSITION_FILE}.{os.getpid()}").symlink_to(victim)
    found = healthcheck.kernel_problems(log, state)
    assert [p.what for p in found] == ["xid 79 on PCI:0000:3b:00"]
    assert victim.read_text() == "{}\n", "root wrote through the link"
    assert position.is_file() and not position.is_symlink()
    assert oct(position.stat().st_mode & 0o777) == "0o600"


def test_the_health_check_refuses_a_folder_others_may_write(tmp_path: Path) -> None:
    log, state = tmp_path / "kern.log", tmp_path / "state"
    log.write_text(f"{XID_79}\n")
    state.mkdir(mode=0o700)
    state.chmod(0o770)
    with pytest.raises(healthcheck.UnsafeStateDir, match="mode 770"):
        healthcheck.kernel_problems(log, state)
    state.chmod(0o700)
    os.chown(state, NOBODY, -1)
    with pytest.raises(healthcheck.UnsafeStateDir, match=f"uid {NOBODY}"):
        healthcheck.kernel_problems(log, state)
    argv = ["--node", "gpu001", "--kernel-log", str(log), "--state-dir", str(state), "--dry-run"]
    assert healthcheck.main(argv) == 2  # said why, drained nothing
    assert not list(state.iterdir())


def test_doctor_names_a_hook_file_its_group_may_write(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir(mode=0o755)
    prolog = hooks / "prolog.sh"
    prolog.write_text("#!/bin/sh\nexit 0\n")
    prolog.chmod(0o755)
    assert check_hook_files([prolog]).status.value == "ok"

    prolog.chmod(0o775)
    check = check_hook_files([prolog])
    print(check)
    assert check.status.value == "FAIL" and check.area.value == "slurm"
    assert f"{prolog} (mode 0775) is writable by its group" in check.detail
    assert "chmod go-w" in check.fix

    prolog.chmod(0o755)
    hooks.chmod(0o777)  # anyone could swap the file for another
    assert f"{hooks} (mode 0777) is writable by everyone" in check_hook_files([prolog]).detail
