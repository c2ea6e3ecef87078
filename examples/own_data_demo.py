"""Day one of a team with its own corpus, on the dev cluster, with the commands a user types.

    python examples/own_data_demo.py [--root .runyard/own-data-demo] [--steps 150]

1. a corpus (Python's standard library as .txt documents) and a BPE tokenizer trained on it
   with `tokenizers`, saved as a Hugging Face tokenizer folder;
2. `runyard data prepare` with that tokenizer;
3. a Llama checkpoint for that vocabulary, saved by transformers with the tokenizer beside it
   (random weights here: no published checkpoint is reachable offline);
4. a run that starts from it, `model: {from_hf: ...}`, on two nodes, watched to the end;
5. `runyard run export --format hf`, and transformers loads the folder and generates text.
Needs `runyard dev up` (the service and the Slurm nodes) and the worker's packages.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import yaml

EOS, BOS = "<|end_of_text|>", "<|begin_of_text|>"
VOCAB = 512  # a multiple of 128: the model's vocabulary is the tokenizer's
RUNYARD = [str(Path(sys.executable).with_name("runyard"))]  # the venv's console script


def runyard(*args: str) -> str:
    """A runyard command as a user runs it; its stdout (stops the demo if it fails)."""
    print(f"$ runyard {' '.join(args)}", flush=True)
    done = subprocess.run([*RUNYARD, *args], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.exit(f"runyard {args[0]} {args[1]} failed with exit code {done.returncode}")
    return done.stdout


def corpus_and_tokenizer(root: Path) -> tuple[Path, Path]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [path.read_text() for path in sorted(stdlib.glob("*.py"))[:80]]
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for i, text in enumerate(texts):
        (corpus / f"{i:03d}.txt").write_text(text)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    folder = root / "bpe"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"eos_token": EOS, "bos_token": BOS, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return corpus, folder


def llama_checkpoint(root: Path, tokenizer: Path, eos_id: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=384, vocab_size=VOCAB, rope_theta=10000.0, eos_token_id=eos_id,
        bos_token_id=None, max_position_embeddings=128,
    )  # fmt: skip
    folder = root / "llama-start"
    LlamaForCausalLM(config).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer / name, folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(".runyard/own-data-demo"))
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    corpus, tokenizer = corpus_and_tokenizer(root)
    data = root / "data"
    runyard("data", "prepare", str(corpus), "--tokenizer", str(tokenizer), "--out", str(data),
            "--val-fraction", "0.05")  # fmt: skip
    eos_id = json.loads((data / "index.json").read_text())["tokenizer"]["eos_id"]
    start = llama_checkpoint(root, tokenizer, eos_id)
    spec = {
        "name": "own-data-demo", "model": {"from_hf": str(start)}, "data": str(data),
        "nodes": 2, "gpus_per_node": 1, "seq_len": 128, "global_batch": 8,
        "steps": args.steps, "lr": 3e-3, "checkpoint_every": 50, "eval_every": 50,
    }  # fmt: skip
    (root / "run.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_id = str(json.loads(runyard("run", "submit", str(root / "run.yaml"), "--json"))["id"])
    print(runyard("run", "watch", run_id, "--timeout-s", "900"))
    exported = root / "exported"
    print(runyard("run", "export", run_id, "--format", "hf", "--out", str(exported)))

    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf_tokenizer = AutoTokenizer.from_pretrained(exported)
    model = AutoModelForCausalLM.from_pretrained(exported)
    prompt = hf_tokenizer("def __init__(self", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=40, do_sample=False)
    print("transformers generates from the exported folder:")
    print(hf_tokenizer.decode(generated[0]))


if __name__ == "__main__":
    main()
