"""The pieces of the parallel layouts that one process can check: pipeline splits, context
parallel's sequence layout, float8 conversion (emulated on CPU), torch.compile and
activation checkpointing against eager, and the asynchronous checkpointer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_helpers import tiny_spec

from contract import Float8Scaling, ModelShape, WorkerRunConfig
from worker import checkpoint
from worker.distributed import init_distributed, shutdown_distributed
from worker.launch import read_launch_env
from worker.model import Transformer, build_model
from worker.parallel.context_parallel import local_positions, shard_sequence
from worker.parallel.pipeline import split_layers, stage_ids, stage_model
from worker.reporter import FileReporter
from worker.train import train

SHAPE = ModelShape(layers=4, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)


@pytest.mark.parametrize(
    ("layers", "stages", "sizes"),
    [
        (8, 4, [2, 2, 2, 2]),
        (10, 4, [2, 3, 3, 2]),  # extras in the middle: the ends hold embedding and loss
        (3, 2, [2, 1]),
        (126, 16, [7] + [8] * 14 + [7]),  # Llama 3 405B: one block fewer on the end stages
    ],
)
def test_pipeline_split_is_contiguous_and_puts_extras_in_the_middle(
    layers: int, stages: int, sizes: list[int]
) -> None:
    split = split_layers(layers, stages)
    assert [len(s) for s in split] == sizes
    assert [i for stage in split for i in stage] == list(range(layers))


def test_interleaved_stages_loop_over_the_ranks() -> None:
    assert [stage_ids(r, pp=2, vp=2) for r in range(2)] == [[0, 2], [1, 3]]
    assert stage_ids(0, pp=4, vp=1) == [0]


def test_a_stage_keeps_the_whole_models_parameter_names() -> None:
    with torch.device("meta"):
        whole = Transformer(SHAPE, max_seq_len=32)
    first, last = stage_model(whole, 0, 2), stage_model(whole, 1, 2)
    assert list(first.layers) == ["0", "1"] and list(last.layers) == ["2", "3"]
    assert first.output is None and last.tok_embeddings is None
    names = {n for n, _ in whole.named_parameters()}
    first_names = {n for n, _ in first.named_parameters()}
    last_names = {n for n, _ in last.named_parameters()}
    assert first_names | last_names == names and not first_names & last_names


def test_a_stage_initialises_to_the_whole_models_weights() -> None:
    """Per-parameter seeds: pipeline stages and the whole model draw the same numbers."""
    whole = build_model(SHAPE, seed=3, device=torch.device("cpu"), max_seq_len=32)
    with torch.device("meta"):
        part = stage_model(Transformer(SHAPE, max_seq_len=32), 1, 2)
    part.to_empty(device="cpu")
    part.init_weights(seed=3)
    for name, param in part.named_parameters():
        assert torch.equal(param, whole.get_parameter(name)), name


def test_context_parallel_gives_each_rank_an_early_and_a_late_chunk() -> None:
    assert local_positions(16, cp=2, cp_rank=0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(16, cp=2, cp_rank=1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    tokens = torch.arange(32).view(2, 16)
    shards = [shard_sequence(tokens, 2, r) for r in range(2)]
    positions = torch.cat([local_positions(16, 2, r) for r in range(2)])
    rebuilt = torch.empty_like(tokens)
    rebuilt[:, positions] = torch.cat(shards, dim=1)
    assert torch.equal(rebuilt, tokens)


@pytest.mark.parametrize("scaling", list(Float8Scaling))
def test_float8_swaps_the_linears_but_not_the_output_head(scaling: Float8Scaling) -> None:
    """torchao's float8 on CPU with emulated GEMMs: the same code path H100s take, minus
    the FP8 tensor cores (the worker refuses fp8 on CPU; this calls the swap directly)."""
    pytest.importorskip("torchao.float8")
    from worker.parallel.float8 import apply_float8

    dtype = torch.bfloat16 if scaling is Float8Scaling.ROWWISE else torch.float32
    model = build_model(SHAPE, seed=0, device=torch.device("cpu"), max_seq_len=32).to(dtype)
    reference = build_model(SHAPE, seed=0, device=torch.device("cpu"), max_seq_len=32).to(dtype)
    apply_float8(model, scaling, emulate=True)
    swapped = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert len(swapped) == SHAPE.layers * 7 and "output" not in swapped
    tokens = torch.randint(0, SHAPE.vocab, (2, 32))
    logits = model(tokens)
    logits.float().square().mean().backward()
    assert model.layers["0"].attention.wq.weight.grad is not None
    # FP8 (e4m3, 3 mantissa bits) rounds; the logits stay close to the unconverted model's.
    with torch.no_grad():
        error = (logits.float() - reference(tokens).float()).abs().max().item()
    assert 0 < error < 0.1


def read_losses(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "metric"}


def run(tmp_path: Path, data_cache_dir: Path, name: str, **spec: Any) -> dict[int, float]:
    config = WorkerRunConfig.model_validate(
        tiny_spec(tmp_path / name, data_cache_dir, model=SHAPE.model_dump(), seq_len=32,
                  steps=4, checkpoint_every=2) | spec
    )  # fmt: skip
    metrics = tmp_path / f"{name}.jsonl"
    train(config, read_launch_env({}), FileReporter(metrics))
    return read_losses(metrics)


@pytest.mark.heavy  # torch.compile: 4.5-5 s, make test-all
def test_compile_and_recompute_train_like_eager_and_share_checkpoints(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile (aot_eager here: the same tracing, no kernel generation) with full
    recompute matches eager; its checkpoint (parameter names with wrapper segments
    stripped) resumes in an eager run."""
    monkeypatch.setenv("RUNYARD_COMPILE_BACKEND", "aot_eager")
    eager = run(tmp_path, data_cache_dir, "eager", layout={"micro_batch_size": 8})
    compiled = run(
        tmp_path, data_cache_dir, "compiled",
        layout={"micro_batch_size": 8, "compile": True, "recompute": "full"},
    )  # fmt: skip
    for step, loss in eager.items():
        assert compiled[step] == pytest.approx(loss, abs=1e-5), step
    resumed = run(
        tmp_path, data_cache_dir, "resumed", layout={"micro_batch_size": 4},
        resume_from={"step": 2, "path": str(tmp_path / "compiled" / "step_00000002")},
    )  # fmt: skip
    assert sorted(resumed) == [3, 4]
    for step, loss in resumed.items():
        assert loss == pytest.approx(eager[step], abs=1e-5), step


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    init_distributed(read_launch_env({}), torch.device("cpu"))
    yield
    shutdown_distributed()


def test_async_save_commits_only_once_written(tmp_path: Path, one_rank_world: None) -> None:
    model = build_model(SHAPE, seed=0, device=torch.device("cpu"), max_seq_len=32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = checkpoint.TrainerState(step=4, data_step=4)
    state = checkpoint.training_state([model], [optimizer], trainer, rank=0)
    saver = checkpoint.AsyncCheckpointer(tmp_path, state)
    saver.save(4)
    folder = checkpoint.step_folder(tmp_path, 4)
    assert not (folder / checkpoint.MARKER).exists()  # written in the background, not committed
    with pytest.raises(RuntimeError, match="still being saved"):
        saver.save(5)
    saved = saver.wait()
    assert saved is not None and saved.step == 4 and (folder / checkpoint.MARKER).exists()
    assert saved.num_bytes > 0 and saved.blocking_s < saved.write_s
    assert saver.wait() is None and saver.poll() is None  # nothing in flight
    assert checkpoint.latest_committed(tmp_path).step == 4  # type: ignore[union-attr]
