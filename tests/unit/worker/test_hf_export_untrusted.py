"""`runyard run export` of a checkpoint whose files hold code (issue 38, finding 1).

The export runs as whoever types it (a teammate, an admin) on files the run's owner wrote.
A `.metadata` pickle that runs a command when unpickled, alone or tucked inside real DCP
metadata, is refused with one line that names the file and says it holds code, and the
command never runs; the same file read by DCP's own reader does run it (the tests are not
vacuous). A checkpoint cannot point the export at files outside its folder either. A
legitimate checkpoint still exports, and the tensors read are exactly what DCP reads.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import pickle
import shlex
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from typer.testing import CliRunner

from client.api import RunyardClient
from client.cli import app as cli
from contract import ModelShape
from worker.checkpoint import MARKER
from worker.hf.dcp_reader import UntrustedCheckpointError, read_tensors
from worker.hf.export import ExportError, export_hf
from worker.model import Transformer

SHAPE = ModelShape(layers=1, hidden=32, heads=2, kv_heads=1, ffn=64, vocab=64)
RUN_ID, STEP = 7, 10


class RunsCommand:
    """Unpickled, runs `touch marker` through the shell: os.system, the classic payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


class TouchesFile:
    """Unpickled, creates `marker` with no shell: a method reached by its qualified name."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def committed_checkpoint(folder: Path) -> Path:
    """A tiny model saved as training saves it (DCP, key "model"), committed."""
    torch.manual_seed(0)
    model = Transformer(SHAPE, max_seq_len=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP: "assuming the intent is to save in a single process"
        dcp.save({"model": model.state_dict()}, checkpoint_id=folder, no_dist=True)
    (folder / MARKER).write_text("{}")
    return folder


def plant(checkpoint: Path, how: str, marker: Path) -> None:
    """The owner rewrites `.metadata`: the payload alone, or inside the real metadata."""
    if how == "alone":
        payload: Any = RunsCommand(marker)
    else:
        with open(checkpoint / ".metadata", "rb") as f:
            payload = pickle.load(f)  # the test's own file, just written by DCP
        payload.planner_data = {"model.output.weight": TouchesFile(marker)}
    (checkpoint / ".metadata").write_bytes(pickle.dumps(payload))


def runyard_run_export(
    monkeypatch: pytest.MonkeyPatch, checkpoint: Path, out: Path
) -> tuple[int, str]:
    """`runyard run export RUN --out OUT` as any user types it, against a service that says
    the run's newest committed checkpoint is `checkpoint`."""
    run = {"id": RUN_ID, "model_shape": SHAPE.model_dump(), "spec": {"data": "builtin"}}
    rows = [{"step": STEP, "path": str(checkpoint), "state": "COMMITTED"}]
    monkeypatch.setenv("RUNYARD_TOKEN", "ry_test")
    monkeypatch.setattr(RunyardClient, "get_run", lambda self, run_id: run)
    monkeypatch.setattr(RunyardClient, "run_checkpoints", lambda self, run_id: rows)
    result = CliRunner().invoke(cli, ["run", "export", str(RUN_ID), "--out", str(out)])
    return result.exit_code, result.output


@pytest.mark.parametrize("how", ["alone", "inside"])
def test_an_export_of_planted_code_refuses_it_and_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    checkpoint = committed_checkpoint(tmp_path / "owner" / f"step_{STEP:08d}")
    marker = tmp_path / "ran-the-owners-code"
    plant(checkpoint, how, marker)

    code, output = runyard_run_export(monkeypatch, checkpoint, tmp_path / "out")

    assert not marker.exists(), "the export ran code the checkpoint's owner planted"
    assert code != 0 and not (tmp_path / "out").exists()
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert str(checkpoint / ".metadata") in lines[0]
    assert "holds code, not data" in lines[0]
    assert ("posix.system" if how == "alone" else "pathlib.Path.touch") in lines[0]


@pytest.mark.parametrize("how", ["alone", "inside"])
def test_the_planted_file_runs_its_code_under_dcps_own_reader(tmp_path: Path, how: str) -> None:
    """What the export did before: DCP's FileSystemReader unpickles `.metadata` as it is."""
    checkpoint = committed_checkpoint(tmp_path / f"step_{STEP:08d}")
    marker = tmp_path / "ran"
    plant(checkpoint, how, marker)
    # "alone" unpickles to os.system's exit status, not metadata: DCP then fails, too late.
    with contextlib.suppress(AttributeError):
        dcp.FileSystemReader(str(checkpoint)).read_metadata()
    assert marker.exists()


def test_a_legitimate_checkpoint_exports_and_reads_what_dcp_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = committed_checkpoint(tmp_path / f"step_{STEP:08d}")
    out = tmp_path / "out"
    code, output = runyard_run_export(monkeypatch, checkpoint, out)
    assert code == 0, output
    assert "model.embed_tokens.weight" in load_file(out / "model.safetensors")

    ours = read_tensors(checkpoint, prefix="model.")
    theirs = {name: torch.empty_like(t) for name, t in ours.items()}
    dcp.load({"model": theirs}, checkpoint_id=checkpoint, no_dist=True)  # the test's own file
    assert sorted(ours) == sorted(name for name, _ in Transformer(SHAPE, 16).named_parameters())
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


def test_a_checkpoint_cannot_point_the_export_outside_its_folder(tmp_path: Path) -> None:
    checkpoint = committed_checkpoint(tmp_path / "run" / f"step_{STEP:08d}")
    (data,) = checkpoint.glob("*.distcp")
    with open(checkpoint / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # the test's own file

    # A data file named by a path: the metadata says "../<file>".
    shutil.copyfile(data, checkpoint.parent / data.name)
    for info in metadata.storage_data.values():
        info.relative_path = f"../{data.name}"
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(ExportError, match="not at a file of the checkpoint folder"):
        export_hf(checkpoint, SHAPE, tmp_path / "out")

    # A data file that is a link to a file elsewhere.
    for info in metadata.storage_data.values():
        info.relative_path = data.name
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    data.unlink()
    data.symlink_to(checkpoint.parent / data.name)
    with pytest.raises(UntrustedCheckpointError, match="is a link"):
        read_tensors(checkpoint, prefix="model.")
