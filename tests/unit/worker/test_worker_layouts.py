"""Every layout trains to the same losses as a plain single-process loop, and checkpoints
written by one layout resume in another.

Four gloo ranks under torchrun train each layout of LAYOUTS for STEPS steps on the same tiny
model and data (one launch for all of them: see layout_driver.py); a hand-written fp32 loop
in this process (no mesh, no wrappers) is the reference. Then checkpoints cross layouts and
world sizes: FSDP over 4 ranks resumes as tp2 x dp2, pp2 x dp2, dp 2 on 2 ranks and 1 rank;
pp2 x dp2 resumes as FSDP over 4 ranks. The resumed losses must equal the uninterrupted
run's, which only holds if weights, Adam moments, step counters and data position all
survived the reshard.

Tolerance: fp32 everywhere; the layouts only change the order of floating-point sums (and
Adam amplifies such differences a little each step), so losses agree to LOSS_ATOL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from worker_helpers import clean_env, tiny_spec

from contract import WorkerRunConfig
from worker.checkpoint import MARKER
from worker.data import TokenBatches, open_corpus
from worker.launch import read_launch_env
from worker.model import build_model
from worker.reporter import FileReporter
from worker.train import lr_at, train

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

REPO_ROOT = Path(__file__).resolve().parents[3]
STEPS = int(os.environ.get("RUNYARD_LAYOUT_STEPS", "20"))  # the 20 first losses
EXTRA_STEPS = min(STEPS, 8)  # the combinations beyond the list: fewer, to save time
RESUME_AT, RESUMED_STEPS = STEPS // 2, 3  # resumed runs train steps RESUME_AT + 1 .. + 3
LOSS_ATOL = 1e-5
MODEL = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256}
DEEP_MODEL = MODEL | {"layers": 4}  # interleaved 1F1B: 2 ranks x 2 virtual stages of 1 block

# name -> (layout, model). Global batch 8: micro batch size x accumulation x dp = 8.
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "dp4": ({"dp": 4, "micro_batch_size": 1}, MODEL),
    "zero1": ({"dp": 4, "zero_stage": 1, "micro_batch_size": 1}, MODEL),
    "zero2": ({"dp": 4, "zero_stage": 2, "micro_batch_size": 1}, MODEL),
    "fsdp4": ({"dp": 4, "zero_stage": 3, "micro_batch_size": 1}, MODEL),
    "tp2xdp2": ({"dp": 2, "tp": 2, "micro_batch_size": 4}, MODEL),
    "pp2xdp2": ({"dp": 2, "pp": 2, "micro_batch_size": 2}, MODEL),
    "tp2xpp2": ({"tp": 2, "pp": 2, "micro_batch_size": 4}, MODEL),
    "cp2xdp2": ({"dp": 2, "cp": 2, "micro_batch_size": 4}, MODEL),
    # Beyond the list (EXTRA_STEPS): the other code paths and their combinations.
    "tp2xcp2_selective": ({"tp": 2, "cp": 2, "micro_batch_size": 4, "recompute": "selective"},
                          MODEL),
    "fsdp2xtp2_full": ({"dp": 2, "tp": 2, "zero_stage": 3, "micro_batch_size": 4,
                        "recompute": "full"}, MODEL),
    "interleaved_pp2xdp2": ({"dp": 2, "pp": 2, "vp": 2, "schedule": "interleaved_1f1b",
                             "micro_batch_size": 2}, DEEP_MODEL),
}  # fmt: skip
EXTRAS = ("tp2xcp2_selective", "fsdp2xtp2_full", "interleaved_pp2xdp2")
SAVES_FOR_RESUME = ("fsdp4", "pp2xdp2")
# resumed name -> (source layout, layout, ranks)
RESUMES: dict[str, tuple[str, dict[str, Any], int]] = {
    "fsdp4->tp2xdp2": ("fsdp4", LAYOUTS["tp2xdp2"][0], 4),
    "fsdp4->pp2xdp2": ("fsdp4", LAYOUTS["pp2xdp2"][0], 4),
    "pp2xdp2->fsdp4": ("pp2xdp2", LAYOUTS["fsdp4"][0], 4),
    "fsdp4->dp2 on 2 ranks": ("fsdp4", {"dp": 2, "micro_batch_size": 2}, 2),
}


def layout_spec(root: Path, data_cache_dir: Path, name: str, **overrides: Any) -> dict[str, Any]:
    layout, model = LAYOUTS.get(name, ({}, MODEL))
    spec = tiny_spec(
        root / name.replace(" ", "_").replace(">", ""),
        data_cache_dir,
        model=model,
        layout=layout,
        seq_len=32,
        global_batch=8,
        steps=EXTRA_STEPS if name in EXTRAS else STEPS,
        warmup_steps=3,
        checkpoint_every=RESUME_AT if name in SAVES_FOR_RESUME else 1000,
        # Reports (the loop's host syncs) at steps 1 and 2, then only at checkpoints and at
        # the end: every step's loss must still come back right from windows of many steps.
        report_interval_s=3600.0,
    )
    return spec | overrides


def resume_point(root: Path, source: str) -> dict[str, Any]:
    return {"step": RESUME_AT, "path": str(root / source / f"step_{RESUME_AT:08d}")}


def read_losses(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["kind"] == "metric"}


def reference_losses(model: dict[str, int], steps: int, data_cache_dir: Path) -> dict[int, float]:
    """A hand-written single-process fp32 loop over the same model, data and schedule."""
    config = WorkerRunConfig.model_validate(
        tiny_spec(Path("unused"), data_cache_dir, model=model, seq_len=32, steps=steps,
                  warmup_steps=3, layout={"micro_batch_size": 8})
    )  # fmt: skip
    net = build_model(config.model, config.seed, torch.device("cpu"), config.seq_len)
    params = list(net.parameters())
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.95),
    )  # fmt: skip
    batches = TokenBatches(open_corpus("builtin", data_cache_dir), 32, 8, config.seed)
    losses = {}
    for step in range(1, steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        inputs, targets = batches.micro_batch(step, 0, 0, 1, 8)
        loss = F.cross_entropy(net(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        losses[step] = loss.item()
    return losses


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, data_cache_dir: Path) -> dict[str, Any]:
    """Train every layout and every resume in one 4-rank torchrun launch."""
    root = tmp_path_factory.mktemp("layouts")
    scenarios = [
        {"name": name, "world_size": 4, "metrics": str(root / f"{name}.jsonl"),
         "config": layout_spec(root, data_cache_dir, name)}
        for name in LAYOUTS
    ]  # fmt: skip
    for name, (source, layout, ranks) in RESUMES.items():
        # Reports every step (a stop is seen at a report): the stop lands on the next step.
        config = layout_spec(root, data_cache_dir, name, layout=layout,
                             resume_from=resume_point(root, source),
                             report_interval_s=1e-3)  # fmt: skip
        scenarios.append({"name": name, "world_size": ranks, "config": config,
                          "metrics": str(root / f"{name}.jsonl"),
                          "stop_after": RESUME_AT + RESUMED_STEPS - 1})  # fmt: skip
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
    return {"root": root, "losses": losses}


@pytest.fixture(scope="module")
def references(data_cache_dir: Path) -> dict[str, dict[int, float]]:
    """Reference losses of each layout, from the hand-written loop (computed once each)."""
    cache: dict[tuple[int, int], dict[int, float]] = {}
    found = {}
    for name, (_, model) in LAYOUTS.items():
        steps = EXTRA_STEPS if name in EXTRAS else STEPS
        key = (model["layers"], steps)
        if key not in cache:
            cache[key] = reference_losses(model, steps, data_cache_dir)
        found[name] = cache[key]
    return found


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_the_single_process_reference(
    name: str, runs: dict[str, Any], references: dict[str, dict[int, float]]
) -> None:
    expected, got = references[name], runs["losses"][name]
    assert sorted(got) == sorted(expected)
    assert got[len(got)] < got[1] - 0.5  # it learned, too
    for step, loss in got.items():
        assert loss == pytest.approx(expected[step], abs=LOSS_ATOL), (name, step)


@pytest.mark.parametrize("name", list(RESUMES))
def test_a_checkpoint_resumes_in_another_layout(name: str, runs: dict[str, Any]) -> None:
    source = RESUMES[name][0]
    uninterrupted, resumed = runs["losses"][source], runs["losses"][name]
    # Asked to stop after step RESUME_AT + RESUMED_STEPS - 1, the loop ends one step later.
    last = min(RESUME_AT + RESUMED_STEPS, STEPS)
    assert sorted(resumed) == list(range(RESUME_AT + 1, last + 1))
    for step, loss in resumed.items():
        assert loss == pytest.approx(uninterrupted[step], abs=LOSS_ATOL), (name, step)


def test_fsdp_checkpoint_resumes_on_one_rank(
    runs: dict[str, Any], data_cache_dir: Path, tmp_path: Path
) -> None:
    """The same checkpoint in a one-process world: what a run with a single node left does."""
    folder = Path(resume_point(runs["root"], "fsdp4")["path"])
    assert (folder / MARKER).exists()
    assert len(list(folder.glob("*.distcp"))) == 4  # every rank wrote its own shards
    spec = layout_spec(tmp_path, data_cache_dir, "one rank", layout={"micro_batch_size": 4},
                       resume_from=resume_point(runs["root"], "fsdp4"),
                       steps=STEPS)  # fmt: skip
    metrics = tmp_path / "one.jsonl"
    config = WorkerRunConfig.model_validate(spec)
    train(config, read_launch_env({}), FileReporter(metrics))
    uninterrupted = runs["losses"]["fsdp4"]
    for step, loss in read_losses(metrics).items():
        assert loss == pytest.approx(uninterrupted[step], abs=LOSS_ATOL), step
