"""Write a committed DCP checkpoint as a Hugging Face Llama folder.

    python -m worker.hf.export --checkpoint CKPT/step_00000100 --shape '{"layers": 2, ...}' \
        --out DIR [--tokenizer TOKENIZER_DIR] [--max-shard-mb 2048]

`runyard run export` runs this on a machine that sees the shared filesystem and has torch:
it reads the checkpoint's model weights directly (no process group: one process reads every
rank's shards, whatever layout and world size wrote them), converts them to Hugging Face's
names and rotary layout, and writes config.json, safetensors shards (with an index when
there are several) and the tokenizer's files.

The export runs as whoever types it, on files the run's owner wrote, so it reads them as
data only (worker/hf/dcp_reader.py): never with `dcp.load`, whose `.metadata` is a plain
pickle that could run the owner's code with the exporter's rights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from contract import ModelShape, hf_config_from_shape
from worker.checkpoint import MARKER, is_committed
from worker.hf.convert import hf_name, to_hf
from worker.hf.dcp_reader import UntrustedCheckpointError, read_tensors
from worker.model import Transformer

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
)
DEFAULT_MAX_SHARD_MB = 4096  # transformers' own save_pretrained default is 5 GB (50 GB in 5.x)


class ExportError(Exception):
    """A checkpoint or destination the export cannot use; the message says which and why."""


def read_model_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The whole model's weights in a committed checkpoint, by the worker's names, read as
    data only: a checkpoint whose files hold code is refused, and nothing in it runs."""
    if not is_committed(checkpoint):
        raise ExportError(f"{checkpoint} has no {MARKER} marker: export a committed checkpoint")
    try:
        return read_tensors(checkpoint, prefix="model.")
    except UntrustedCheckpointError as exc:
        raise ExportError(str(exc)) from None


def hf_tensors(weights: dict[str, torch.Tensor], shape: ModelShape) -> dict[str, torch.Tensor]:
    """Hugging Face's tensors, in the model's order, from the worker's weights."""
    with torch.device("meta"):  # names and shapes only: no memory
        model = Transformer(shape, max_seq_len=1)
    expected = {name: param.shape for name, param in model.named_parameters()}
    missing = [name for name in expected if name not in weights]
    if missing:
        raise ExportError(f"the checkpoint lacks {missing[:3]}: it was not written for {shape}")
    out = {}
    for name in expected:
        if weights[name].shape != expected[name]:
            raise ExportError(f"{name} has shape {tuple(weights[name].shape)}, not the run's")
        out[hf_name(name)] = to_hf(name, weights[name], shape)
    return out


def write_shards(tensors: dict[str, torch.Tensor], out: Path, max_shard_bytes: int) -> list[str]:
    """safetensors files of at most `max_shard_bytes` each (a larger tensor alone), named as
    save_pretrained names them, and the index when there is more than one."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], out / "model.safetensors", metadata={"format": "pt"})
        return ["model.safetensors"]
    files, weight_map = [], {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / file, metadata={"format": "pt"})
        files.append(file)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files


def copy_tokenizer(folder: Path, out: Path, expected_sha256: str | None) -> list[str]:
    """The tokenizer's files, after checking it is the one the data was tokenized with."""
    source = folder / "tokenizer.json"
    if not source.is_file():
        raise ExportError(f"{folder} has no tokenizer.json")
    if expected_sha256 and hashlib.sha256(source.read_bytes()).hexdigest() != expected_sha256:
        raise ExportError(
            f"{source} is not the tokenizer the run's data was prepared with (sha256 differs)"
        )
    copied = [name for name in TOKENIZER_FILES if (folder / name).is_file()]
    for name in copied:
        shutil.copyfile(folder / name, out / name)
    return copied


def export_hf(
    checkpoint: Path,
    shape: ModelShape,
    out: Path,
    *,
    tokenizer: Path | None = None,
    tokenizer_sha256: str | None = None,
    max_positions: int = 2048,
    eos_id: int | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_MB << 20,
) -> list[str]:
    """Write `checkpoint` as a Hugging Face folder `out` (new or empty); returns its files."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty folder: choose a new --out")
    tensors = hf_tensors(read_model_weights(checkpoint), shape)
    out.mkdir(parents=True, exist_ok=True)
    files = write_shards(tensors, out, max_shard_bytes)
    config = hf_config_from_shape(shape, max_position_embeddings=max_positions)
    if eos_id is not None:
        config["eos_token_id"] = eos_id
    (out / "config.json").write_text(json.dumps(config, indent=2))
    files.append("config.json")
    if tokenizer is not None:
        files += copy_tokenizer(tokenizer, out, tokenizer_sha256)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.hf.export", description=__doc__)
    parser.add_argument("--checkpoint", type=Path, required=True, help="a committed step folder")
    parser.add_argument("--shape", required=True, help="the run's ModelShape as JSON")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer folder")
    parser.add_argument("--tokenizer-sha256", help="refuse a tokenizer.json with another hash")
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--eos-id", type=int)
    parser.add_argument("--max-shard-mb", type=int, default=DEFAULT_MAX_SHARD_MB)
    args = parser.parse_args(argv)
    try:
        files = export_hf(
            args.checkpoint,
            ModelShape.model_validate_json(args.shape),
            args.out,
            tokenizer=args.tokenizer,
            tokenizer_sha256=args.tokenizer_sha256,
            max_positions=args.max_positions,
            eos_id=args.eos_id,
            max_shard_bytes=args.max_shard_mb << 20,
        )
    except (ExportError, OSError) as exc:
        print(f"export: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"out": str(args.out), "files": files}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
