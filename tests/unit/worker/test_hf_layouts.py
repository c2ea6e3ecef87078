"""A Hugging Face checkpoint loads into any parallel layout, and exports from any.

Four gloo ranks under torchrun (one launch: layout_driver.py) start the same random
LlamaForCausalLM checkpoint as FSDP over 4 ranks, tp2 x dp2 and pp2 x dp2, and train 3 steps.
The first step's loss, taken before any update, must equal what transformers computes for
that batch with the original model: each layout loaded exactly Hugging Face's weights. The
later losses agree across layouts, and the checkpoints they end with export to the same
Hugging Face tensors.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hf_helpers import hf_logits, save_random_llama
from safetensors.torch import load_file
from worker_helpers import clean_env, tiny_spec

from contract import read_hf_checkpoint
from worker.data import TokenBatches, open_corpus
from worker.hf.export import export_hf

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

REPO_ROOT = Path(__file__).resolve().parents[3]
STEPS, SEQ_LEN, GLOBAL_BATCH = 3, 32, 8
LOSS_ATOL = 1e-5  # fp32; layouts only reorder floating-point sums (test_worker_layouts.py)
LAYOUTS: dict[str, dict[str, Any]] = {
    "fsdp4": {"dp": 4, "zero_stage": 3, "micro_batch_size": 1},
    "tp2xdp2": {"dp": 2, "tp": 2, "micro_batch_size": 4},
    "pp2xdp2": {"dp": 2, "pp": 2, "micro_batch_size": 2},
}


def read_losses(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "metric"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_cache_dir: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hf-layouts")
    source = root / "hf"
    save_random_llama(source, max_shard_size="40KB")
    shape = read_hf_checkpoint(source)
    scenarios = []
    for name, layout in LAYOUTS.items():
        config = tiny_spec(
            root / name, data_cache_dir, model=shape.model_dump(), layout=layout,
            seq_len=SEQ_LEN, global_batch=GLOBAL_BATCH, steps=STEPS, checkpoint_every=STEPS,
            init_from_hf=str(source), report_interval_s=1e-3,
        )  # fmt: skip
        scenarios.append({"name": name, "world_size": 4, "config": config,
                          "metrics": str(root / f"{name}.jsonl")})  # fmt: skip
    plan = root / "plan.json"
    plan.write_text(json.dumps({"store": str(root / "store"), "scenarios": scenarios}))
    driver = Path(__file__).with_name("layout_driver.py")
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         str(driver), str(plan)],
        env=clean_env(PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-5000:] + launch.stderr[-5000:]
    losses = {s["name"]: read_losses(Path(s["metrics"])) for s in scenarios}
    return {"root": root, "source": source, "shape": shape, "losses": losses}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_every_layout_starts_from_the_hugging_face_weights(
    name: str, runs: dict[str, Any], data_cache_dir: Path
) -> None:
    batches = TokenBatches(open_corpus("builtin", data_cache_dir), SEQ_LEN, GLOBAL_BATCH, 1234)
    inputs, targets = batches.micro_batch(1, 0, 0, 1, GLOBAL_BATCH)
    logits = hf_logits(runs["source"], inputs)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten()).item()
    losses = runs["losses"][name]
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[1] == pytest.approx(expected, abs=LOSS_ATOL)
    for step in range(2, STEPS + 1):  # and they train alike from there
        assert losses[step] == pytest.approx(runs["losses"]["fsdp4"][step], abs=LOSS_ATOL)


def test_each_layout_exports_the_same_trained_weights(runs: dict[str, Any]) -> None:
    exported = {}
    for name in LAYOUTS:
        checkpoint = runs["root"] / name / f"step_{STEPS:08d}"
        out = runs["root"] / f"export-{name}"
        export_hf(checkpoint, runs["shape"], out)
        exported[name] = load_file(out / "model.safetensors")
    original = {}
    for file in runs["source"].glob("*.safetensors"):
        original.update(load_file(file))
    reference = exported["fsdp4"]
    assert sorted(reference) == sorted(original)
    # Training moved the weights (lr 3e-3 over 3 steps), so the comparison is not vacuous.
    assert not torch.equal(reference["model.layers.0.self_attn.q_proj.weight"],
                           original["model.layers.0.self_attn.q_proj.weight"])  # fmt: skip
    for name in ("tp2xdp2", "pp2xdp2"):
        for key, tensor in reference.items():
            torch.testing.assert_close(exported[name][key], tensor, rtol=0, atol=1e-5, msg=key)
