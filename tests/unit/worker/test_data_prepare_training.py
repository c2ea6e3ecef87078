"""Training on a prepared dataset: the vocabulary check (contract, then the worker before any
collective) and the held-out loss every eval_every steps, alike under every layout."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch.distributed as dist
from worker_helpers import TINY_MODEL, clean_env, tiny_spec

from contract import (
    DatasetIndex,
    ModelShape,
    WorkerRunConfig,
    check_dataset,
    dataset_problems,
    read_dataset_index,
)
from tests.fixtures.tokenizer_folders import train_bpe_folder
from worker.data_prepare import PrepareSettings, prepare_dataset
from worker.errors import DoNotRetryError
from worker.launch import read_launch_env
from worker.reporter import FileReporter
from worker.train import train

pytest.importorskip("tokenizers")
REPO_ROOT = Path(__file__).resolve().parents[3]
VOCAB = 384  # a multiple of 128: the model's vocab equals the tokenizer's, no padding
MODEL = TINY_MODEL | {"vocab": VOCAB, "hidden": 64, "ffn": 128}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Standard-library sources (~1 MB) as .txt documents, a BPE tokenizer trained on them."""
    root = tmp_path_factory.mktemp("prepared")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [f.read_text() for f in sorted(stdlib.glob("*.py"))[:60]]
    (root / "corpus").mkdir()
    for i, text in enumerate(texts):
        (root / "corpus" / f"{i:03d}.txt").write_text(text)
    tokenizer = train_bpe_folder(root / "bpe", texts, VOCAB)
    settings = PrepareSettings(val_fraction=0.1)
    prepare_dataset([root / "corpus"], tokenizer, root / "data", settings, num_workers=1)
    return root / "data"


def test_dataset_problems_name_the_field_to_change(prepared: Path) -> None:
    index = read_dataset_index(prepared)
    shape = ModelShape(**MODEL)
    assert dataset_problems(index, shape, seq_len=64, eval_every=10) == []
    too_small = shape.model_copy(update={"vocab": 256})
    assert [p.field for p in dataset_problems(index, too_small)] == ["model.vocab"]
    llama3 = shape.model_copy(update={"vocab": 128_256})
    (problem,) = dataset_problems(index, llama3)
    assert problem.field == "model.vocab" and "meant for another tokenizer" in problem.message
    assert index.validation is not None
    long_seq = index.validation.num_tokens + 10
    fields = [p.field for p in dataset_problems(index, shape, seq_len=long_seq, eval_every=5)]
    assert fields == ["eval_every"]
    # The builtin corpus: bytes fit any model of 256 ids or more, but it holds nothing out.
    assert check_dataset("builtin", shape, 64) == []
    assert [p.field for p in check_dataset("builtin", shape, 64, eval_every=5)] == ["eval_every"]
    (missing,) = check_dataset(str(prepared.parent / "nothing"), shape, 64)
    assert missing.field == "data" and "runyard data prepare" in missing.message


def test_an_index_that_contradicts_itself_is_refused(prepared: Path) -> None:
    raw = json.loads((prepared / "index.json").read_text())
    with pytest.raises(ValueError, match="uint8 cannot hold"):
        DatasetIndex.model_validate(raw | {"dtype": "uint8"})
    with pytest.raises(ValueError, match="sum of the shards"):
        DatasetIndex.model_validate(raw | {"num_tokens": raw["num_tokens"] + 1})


def test_the_worker_refuses_another_vocabulary_before_any_collective(
    tmp_path: Path, prepared: Path
) -> None:
    spec = tiny_spec(tmp_path / "ckpt", tmp_path, model=TINY_MODEL, data=str(prepared))
    with pytest.raises(DoNotRetryError, match=r"model\.vocab"):
        train(
            WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(tmp_path / "m")
        )
    assert not dist.is_initialized(), "refused before joining a process group"
    assert not (tmp_path / "ckpt").exists()


def _rows(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def test_validation_loss_every_eval_every_steps(tmp_path: Path, prepared: Path) -> None:
    spec = tiny_spec(
        tmp_path / "ckpt", tmp_path, model=MODEL, data=str(prepared), steps=30, eval_every=10
    )
    metrics = tmp_path / "metrics.jsonl"
    train(WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(metrics))
    validation = _rows(metrics, "validation")
    assert [row["step"] for row in validation] == [10, 20, 30]
    losses = [row["loss"] for row in validation]
    assert losses[0] < math.log(VOCAB) - 0.5  # it has learned something by step 10
    assert losses[0] > losses[1] > losses[2], losses  # and goes on learning
    assert len(_rows(metrics, "metric")) == 30, "evaluation leaves the training metrics alone"


@pytest.mark.heavy  # ranks as processes under two layouts: 12 s, make test-all
def test_validation_loss_is_the_same_under_pipeline_and_data_parallel(
    tmp_path: Path, prepared: Path
) -> None:
    """pp2 x dp2 over four gloo ranks scores the held-out split as one process does."""
    overrides = {"model": MODEL, "data": str(prepared), "steps": 4, "eval_every": 2}
    single = tiny_spec(tmp_path / "one", tmp_path, **overrides, layout={"micro_batch_size": 4})
    one_metrics = tmp_path / "one.jsonl"
    train(WorkerRunConfig.model_validate(single), read_launch_env({}), FileReporter(one_metrics))
    layout = {"dp": 2, "pp": 2, "micro_batch_size": 2}
    spec = tiny_spec(tmp_path / "pp", tmp_path, **overrides, layout=layout)
    spec["model"] = MODEL | {"layers": 2}
    plan = {
        "store": str(tmp_path / "store"),
        "scenarios": [
            {
                "name": "pp2xdp2",
                "world_size": 4,
                "metrics": str(tmp_path / "pp.jsonl"),
                "config": spec,
            }
        ],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    command += [str(Path(__file__).parent / "layout_driver.py"), str(tmp_path / "plan.json")]
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(Path(__file__).parent)]))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = [(r["step"], r["loss"]) for r in _rows(one_metrics, "validation")]
    got = [(r["step"], r["loss"]) for r in _rows(tmp_path / "pp.jsonl", "validation")]
    assert [s for s, _ in got] == [s for s, _ in expected] == [2, 4]
    for (_, a), (_, b) in zip(got, expected, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
