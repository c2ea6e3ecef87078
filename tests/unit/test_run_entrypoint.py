"""`entrypoint:` in a run spec: your own script instead of runyard's trainer, checked at
submission (exactly one of module or script; not with replica groups)."""

from __future__ import annotations

from typing import Any

SPEC: dict[str, Any] = {
    "name": "own-script", "model": "tiny", "nodes": 2, "gpus_per_node": 1, "seq_len": 64,
    "global_batch": 8, "steps": 100, "checkpoint_every": 20,
}  # fmt: skip


def test_a_script_with_arguments_is_accepted(api: Any) -> None:
    entrypoint = {"script": "examples/ddp_train.py", "args": ["--checkpoint-every", "20"]}
    created = api.post("/v1/runs", json=SPEC | {"entrypoint": entrypoint})
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["entrypoint"] == entrypoint | {"module": None}


def test_exactly_one_of_module_or_script(api: Any) -> None:
    both = {"module": "train", "script": "train.py"}
    for entrypoint in (both, {"args": ["x"]}):
        refused = api.post("/v1/runs/dry-run", json=SPEC | {"entrypoint": entrypoint})
        assert refused.status_code == 422
        assert "entrypoint" in refused.text and "exactly one of module or script" in refused.text
    bad = api.post("/v1/runs/dry-run", json=SPEC | {"entrypoint": {"module": "my-train"}})
    assert bad.status_code == 422 and "entrypoint.module" in bad.text


def test_replica_groups_need_runyards_trainer(api: Any) -> None:
    spec = SPEC | {"entrypoint": {"module": "train"}, "fault_tolerance": {"replica_groups": 2}}
    refused = api.post("/v1/runs", json=spec)
    assert refused.status_code == 422 and "classic recovery" in refused.text
