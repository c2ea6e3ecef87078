"""What `runyard run export` picks: the committed checkpoint asked for, and a tokenizer only
when it is the one the run's data was prepared with."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from client.hf_export import ExportChoiceError, export_source
from tests.unit.test_run_data import prepared

SHAPE = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 1024}


def run(data: str, from_hf: Path | None = None) -> dict[str, Any]:
    model: Any = {"from_hf": str(from_hf)} if from_hf else "tiny"
    return {"model_shape": SHAPE, "spec": {"model": model, "data": data, "seq_len": 128}}


def checkpoints(tmp_path: Path, *steps: int) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        (tmp_path / f"step_{step}").mkdir()
        rows.append({"step": step, "path": str(tmp_path / f"step_{step}"), "state": "COMMITTED"})
    return [*rows, {"step": 99, "path": str(tmp_path / "w"), "state": "WRITING"}]


def hf_folder(folder: Path, tokenizer_json: bytes) -> Path:
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer_json)
    return folder


def test_the_newest_commit_or_the_step_asked_for(tmp_path: Path) -> None:
    rows = checkpoints(tmp_path, 20, 40)
    assert export_source(run("builtin"), rows, None, None).step == 40
    assert export_source(run("builtin"), rows, 20, None).path == tmp_path / "step_20"
    with pytest.raises(
        ExportChoiceError, match=r"no committed checkpoint at step 99 \(committed: 20, 40\)"
    ):
        export_source(run("builtin"), rows, 99, None)
    with pytest.raises(ExportChoiceError, match="no committed checkpoint yet"):
        export_source(run("builtin"), [], None, None)
    gone = [{"step": 5, "path": str(tmp_path / "elsewhere"), "state": "COMMITTED"}]
    with pytest.raises(ExportChoiceError, match="not visible from this machine"):
        export_source(run("builtin"), gone, None, None)


def test_the_from_hf_tokenizer_only_when_it_is_the_datas(tmp_path: Path) -> None:
    rows = checkpoints(tmp_path, 10)
    data = prepared(tmp_path / "data", vocab=1000)  # its tokenizer's sha256 is "1" * 64
    other = hf_folder(tmp_path / "other", b"{}")
    chosen = export_source(run(data, other), rows, None, None)
    assert chosen.tokenizer is None and chosen.note and "not the data's" in chosen.note
    assert "pass --tokenizer" in chosen.note and chosen.eos_id == 0
    assert chosen.tokenizer_sha256 == "1" * 64  # an explicit --tokenizer is checked against it

    same = b'{"same": true}'
    folder = hf_folder(tmp_path / "same", same)
    index = Path(data) / "index.json"
    index.write_text(index.read_text().replace("1" * 64, hashlib.sha256(same).hexdigest()))
    chosen = export_source(run(data, folder), rows, None, None)
    assert chosen.tokenizer == folder and chosen.note is None
