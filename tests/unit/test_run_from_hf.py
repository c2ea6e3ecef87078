"""`model: {from_hf: folder}` is planned from the folder's config.json alone: a Llama-family
checkpoint the worker can train is accepted with its shape, anything else is a 422 naming
`model.from_hf` before any Slurm job (the worker converts the weights; worker/hf/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LLAMA_CONFIG: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
    "vocab_size": 256, "rms_norm_eps": 1e-6, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
}  # fmt: skip


def hf_folder(folder: Path, weights: str = "model.safetensors", **changes: Any) -> str:
    """A checkpoint folder as save_pretrained leaves it; the service opens no weight file."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG | changes))
    (folder / weights).write_bytes(b"")
    return str(folder)


def spec(model: Any) -> dict[str, Any]:
    return {
        "name": "from-hf", "model": model, "nodes": 1, "gpus_per_node": 1, "seq_len": 64,
        "global_batch": 4, "steps": 10, "checkpoint_every": 5,
    }  # fmt: skip


def test_a_llama_checkpoint_is_planned_with_its_own_shape(api: Any, shared_path: Path) -> None:
    folder = hf_folder(shared_path / "llama")
    created = api.post("/v1/runs", json=spec({"from_hf": folder}))
    assert created.status_code == 201, created.text
    shape = created.json()["model_shape"]
    assert (shape["layers"], shape["hidden"], shape["heads"], shape["kv_heads"]) == (2, 64, 4, 2)
    assert (shape["ffn"], shape["vocab"], shape["rope_theta"], shape["norm_eps"]) == (
        128, 256, 10000.0, 1e-6,
    )  # fmt: skip
    assert created.json()["spec"]["model"] == {"from_hf": folder}


def test_transformers_4_top_level_rope_theta_and_tied_embeddings_are_accepted(
    api: Any, shared_path: Path
) -> None:
    config = {"rope_parameters": None, "rope_theta": 500000.0, "tie_word_embeddings": True}
    folder = hf_folder(shared_path / "llama", **config)
    decided = api.post("/v1/runs/dry-run", json=spec({"from_hf": folder}))
    assert decided.status_code == 200, decided.text
    assert decided.json()["model"]["rope_theta"] == 500000.0


def refusal(api: Any, folder: str) -> str:
    refused = api.post("/v1/runs", json=spec({"from_hf": folder}))
    assert refused.status_code == 422, refused.text
    detail: str = refused.json()["detail"]
    assert detail.startswith("model.from_hf: "), detail
    return detail


def test_scaled_rope_is_refused_naming_the_field(api: Any, shared_path: Path) -> None:
    llama31 = {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0}
    folder = hf_folder(shared_path / "llama31", rope_parameters=llama31)
    assert "'llama3'" in refusal(api, folder)


def test_another_architecture_is_refused(api: Any, shared_path: Path) -> None:
    assert "'mistral'" in refusal(api, hf_folder(shared_path / "m", model_type="mistral"))
    assert "attention_bias" in refusal(api, hf_folder(shared_path / "b", attention_bias=True))


def test_a_folder_without_safetensors_is_refused(api: Any, shared_path: Path) -> None:
    folder = hf_folder(shared_path / "bin", weights="pytorch_model.bin")
    assert "only safetensors" in refusal(api, folder)
    assert "not a Hugging Face model folder" in refusal(api, str(shared_path / "nothing"))


def test_weights_the_owner_cannot_read_are_refused(api: Any, shared_path: Path) -> None:
    """The check runs as the run's owner, not as the service (nor as root, who reads all):
    weights only their writer may read would fail every rank once the job started."""
    folder = Path(hf_folder(shared_path / "private"))
    (folder / "model.safetensors").chmod(0o600)  # as safetensors writes it; root's
    assert "not readable by the run's owner (mode 0600)" in refusal(api, str(folder))
    (folder / "model.safetensors").chmod(0o644)
    assert api.post("/v1/runs/dry-run", json=spec({"from_hf": str(folder)})).status_code == 200


def test_a_shape_the_worker_cannot_build_is_refused(api: Any, shared_path: Path) -> None:
    folder = hf_folder(shared_path / "odd", num_key_value_heads=3)
    assert "divisible by kv_heads" in refusal(api, folder)
