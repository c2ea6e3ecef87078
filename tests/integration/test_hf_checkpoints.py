"""From a Hugging Face checkpoint, on your own data, back to Hugging Face, on the dev cluster.

A team's day one: a BPE tokenizer trained on its corpus (standard-library sources here),
`runyard data prepare` with it, a Llama checkpoint for that vocabulary saved by transformers
with the tokenizer beside it, a run that starts from it (`model: {from_hf: ...}`) on two
nodes, and `runyard run export --format hf`, whose folder transformers loads, tokenizer and
all, and generates text from.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from client.cli import app
from client.output import Exit
from tests.conftest import ADMIN_UNIX_USER
from tests.fixtures.tokenizer_folders import EOS, train_bpe_folder
from tests.integration.conftest import ServiceProcess

try:  # the worker extra installs it (pyproject.toml): without it the install is broken
    import transformers  # noqa: F401
except ImportError as exc:  # fail, never skip: this is the whole path of from_hf and export
    raise ImportError(
        "transformers is not installed: install runyard's worker extra "
        "(pip install -e '.[worker]'), which this whole-path test needs"
    ) from exc

pytestmark = [pytest.mark.integration, pytest.mark.whole_path]
runner = CliRunner()
VOCAB = 384  # a multiple of 128: the model's vocabulary is the tokenizer's


def cli(service: ServiceProcess, *args: str) -> tuple[int, str]:
    env = {"RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token}
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.output


def own_data_and_checkpoint(root: Path) -> tuple[Path, Path]:
    """A prepared corpus and a random Llama checkpoint (with its tokenizer) that suits it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from worker.data_prepare import PrepareSettings, prepare_dataset

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [f.read_text() for f in sorted(stdlib.glob("*.py"))[:60]]
    (root / "corpus").mkdir()
    for i, text in enumerate(texts):
        (root / "corpus" / f"{i:03d}.txt").write_text(text)
    tokenizer = train_bpe_folder(root / "bpe", texts, VOCAB)
    settings = PrepareSettings(val_fraction=0.1)
    prepare_dataset([root / "corpus"], tokenizer, root / "data", settings, num_workers=1)
    eos_id = json.loads((root / "data" / "index.json").read_text())["tokenizer"]["eos_id"]
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=VOCAB, rope_theta=10000.0, eos_token_id=eos_id,
        bos_token_id=None, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(root / "hf")
    for name in ("tokenizer.json", "tokenizer_config.json"):  # shipped with the weights
        shutil.copyfile(tokenizer / name, root / "hf" / name)
    # The run's owner's own files, as if they had written them: safetensors writes its file
    # 0600, which only its writer (root, here) could read, and the ranks run as the owner.
    for path in [root, *root.rglob("*")]:
        shutil.chown(path, ADMIN_UNIX_USER, ADMIN_UNIX_USER)
    return root / "data", root / "hf"


@pytest.mark.timeout(600)
def test_train_from_hugging_face_on_own_data_and_export(
    service: ServiceProcess, shared_path: Path
) -> None:
    data, hf = own_data_and_checkpoint(shared_path)
    spec = {
        "name": "from-hf", "model": {"from_hf": str(hf)}, "data": str(data), "nodes": 2,
        "gpus_per_node": 1, "seq_len": 64, "global_batch": 8, "steps": 40, "lr": 3e-3,
        "checkpoint_every": 20, "eval_every": 20, "max_restarts": 0,
    }  # fmt: skip
    (shared_path / "run.yaml").write_text(yaml.safe_dump(spec))
    code, out = cli(service, "run", "submit", str(shared_path / "run.yaml"), "--json")
    assert code == 0, out
    run = json.loads(out)
    assert run["model_shape"]["vocab"] == VOCAB and run["model_shape"]["hidden"] == 64
    code, out = cli(
        service, "run", "watch", str(run["id"]), "--interval-s", "1", "--timeout-s", "300"
    )
    assert code == 0 and "SUCCEEDED" in out, out

    exported = shared_path / "exported"
    code, out = cli(
        service, "run", "export", str(run["id"]), "--format", "hf", "--out", str(exported), "--json"
    )
    assert code == 0, out
    answer = json.loads(out)
    assert answer["step"] == 40 and "tokenizer.json" in answer["files"]
    trained, start = load_file(exported / "model.safetensors"), load_file(hf / "model.safetensors")
    assert sorted(trained) == sorted(start)
    assert not torch.equal(trained["model.embed_tokens.weight"], start["model.embed_tokens.weight"])

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert tokenizer.eos_token == EOS and model.config.eos_token_id == tokenizer.eos_token_id
    prompt = tokenizer("def __init__(self", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    text = tokenizer.decode(generated[0])
    assert generated.shape[1] > prompt["input_ids"].shape[1] and text.startswith("def __init__")

    code, out = cli(
        service, "run", "export", str(run["id"]), "--step", "20", "--out", str(shared_path / "s20")
    )
    assert code == 0, out
    code, out = cli(
        service, "run", "export", str(run["id"]), "--step", "7", "--out", str(shared_path / "s7")
    )
    assert code == Exit.USAGE and "no committed checkpoint at step 7 (committed: 20, 40)" in out
