"""A prepared token dataset as both sides see it: its index, and whether a model can train on it.

`runyard data prepare` writes a folder of token shards and, last, `index.json`; the worker
memory-maps the shards. The service reads the same index at submission and the worker reads
it again before its first collective, and both ask `dataset_problems` the same question, so a
dataset tokenized for another vocabulary is refused with one reason wherever it is caught.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from ._frozen import Frozen
from .files import read_small_text
from .model_shape import ModelShape

INDEX_FILE = "index.json"
BUILTIN_DATA = "builtin"
# The builtin corpus is raw bytes (worker/data.py): ids 0..255 whatever the model.
BUILTIN_VOCAB = 256
# Models pad their embedding past the tokenizer's vocabulary to a multiple of 64 or 128 for
# tensor-core-friendly matmuls (Megatron-LM's --make-vocab-size-divisible-by defaults to 128);
# a model larger than that was built for another tokenizer.
VOCAB_PAD_MULTIPLE = 128

TokenDtype = Literal["uint8", "uint16", "uint32"]
_DTYPE_BITS = {"uint8": 8, "uint16": 16, "uint32": 32}


def dtype_for_vocab(vocab: int) -> TokenDtype:
    """The smallest unsigned integer type that holds every id below `vocab`."""
    if vocab <= 2**8:
        return "uint8"
    if vocab <= 2**16:
        return "uint16"
    return "uint32"


class ShardFile(Frozen):
    """One flat file of tokens in the folder."""

    file: str = Field(description="File name inside the dataset folder.")
    num_tokens: int = Field(ge=0, description="Tokens in the file (its size / the dtype's size).")


class TokenSplit(Frozen):
    """A part of the corpus stored apart from the training tokens (the held-out split)."""

    num_tokens: int = Field(ge=0)
    num_documents: int = Field(ge=0)
    sha256: str = Field(description="Of the split's tokens as stored, to compare two packings.")
    shards: tuple[ShardFile, ...]


class TokenizerIdentity(Frozen):
    """Which tokenizer produced the ids: a model must be trained and served with this one."""

    name: str = Field(description="The tokenizer folder's name when the data was prepared.")
    sha256: str = Field(description="Of its tokenizer.json: two folders with it encode alike.")
    vocab: int = Field(ge=2, description="Ids it can produce, added tokens included.")
    eos_id: int = Field(ge=0, description="The id written after every document.")
    eos_token: str


class DatasetIndex(Frozen):
    """`index.json`: format 1 is the builtin byte corpus; format 2 a tokenized corpus with a
    held-out split, document boundaries (EOS after each) and its tokenizer's identity."""

    format: Literal[1, 2]
    dtype: TokenDtype
    vocab: int = Field(ge=2, description="Every id in the shards is below this.")
    num_tokens: int = Field(ge=0, description="Training tokens (all shards).")
    sha256: str = Field(description="Of the training tokens, to compare two packings.")
    source: str = Field(description="What was tokenized, for people.")
    shards: tuple[ShardFile, ...] = Field(description="The training split, in stream order.")
    num_documents: int | None = Field(default=None, ge=0, description="Training documents.")
    validation: TokenSplit | None = Field(default=None, description="The held-out split.")
    tokenizer: TokenizerIdentity | None = None

    @model_validator(mode="after")
    def _consistent(self) -> DatasetIndex:
        if sum(s.num_tokens for s in self.shards) != self.num_tokens:
            raise ValueError("num_tokens is not the sum of the shards' num_tokens")
        if _DTYPE_BITS[dtype_for_vocab(self.vocab)] > _DTYPE_BITS[self.dtype]:
            raise ValueError(f"dtype {self.dtype} cannot hold ids up to vocab {self.vocab}")
        if self.format == 2 and (self.tokenizer is None or self.validation is None):
            raise ValueError("a format 2 index names its tokenizer and its validation split")
        if self.tokenizer is not None and self.tokenizer.vocab != self.vocab:
            raise ValueError(f"vocab {self.vocab} differs from tokenizer.vocab")
        return self


class DatasetIndexError(ValueError):
    """A `data` folder with no readable, valid `index.json` (not prepared, or half-written)."""


@dataclass(frozen=True, slots=True)
class DatasetProblem:
    """One reason a run cannot train on a dataset; `field` is the run spec field to change."""

    field: str
    message: str


def read_dataset_index(folder: Path) -> DatasetIndex:
    """The index of a prepared folder; DatasetIndexError says what is wrong with it."""
    path = folder / INDEX_FILE
    try:
        raw = json.loads(read_small_text(path))  # a FIFO or a device is refused, not read
    except FileNotFoundError:
        raise DatasetIndexError(
            f"{path} missing: not a prepared dataset (run `runyard data prepare`, which "
            "writes it last)"
        ) from None
    except (OSError, ValueError) as exc:
        raise DatasetIndexError(f"cannot read {path}: {exc}") from None
    try:
        return DatasetIndex.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "index"
        raise DatasetIndexError(f"{path}: {where}: {first['msg']}") from None


def dataset_problems(
    index: DatasetIndex,
    model: ModelShape,
    seq_len: int | None = None,
    eval_every: int | None = None,
) -> list[DatasetProblem]:
    """Why `model` cannot train on this dataset at `seq_len` (and evaluate every `eval_every`
    steps on its held-out split); empty when it can."""
    problems = []
    names = f"tokenizer {index.tokenizer.name!r}" if index.tokenizer else "the data"
    if index.vocab > model.vocab:
        problems.append(
            DatasetProblem(
                "model.vocab",
                f"{names} has {index.vocab} token ids but the model's embedding has "
                f"model.vocab={model.vocab}: use a model with the tokenizer's vocabulary",
            )
        )
    padded = -(-index.vocab // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    if index.tokenizer is not None and model.vocab > padded:
        problems.append(
            DatasetProblem(
                "model.vocab",
                f"model.vocab={model.vocab} is larger than {names}'s {index.vocab} ids "
                f"padded to a multiple of {VOCAB_PAD_MULTIPLE} ({padded}): the model is "
                "meant for another tokenizer; prepare the data with that one",
            )
        )
    if seq_len is not None and index.num_tokens < seq_len + 1:
        problems.append(
            DatasetProblem(
                "data",
                f"the data has {index.num_tokens} training tokens, fewer than seq_len + 1 "
                f"({seq_len + 1})",
            )
        )
    if eval_every is not None:
        held_out = index.validation.num_tokens if index.validation else 0
        if index.validation is None:
            problems.append(
                DatasetProblem(
                    "eval_every",
                    "the data has no held-out split to evaluate on (the builtin corpus has "
                    "none): prepare a dataset with `runyard data prepare`",
                )
            )
        elif seq_len is not None and held_out < seq_len + 1:
            problems.append(
                DatasetProblem(
                    "eval_every",
                    f"the held-out split has {held_out} tokens, fewer than seq_len + 1 "
                    f"({seq_len + 1}): prepare with a larger --val-fraction",
                )
            )
    return problems


def check_dataset(
    data: str, model: ModelShape, seq_len: int, eval_every: int | None = None
) -> list[DatasetProblem]:
    """The submission check: `data` ("builtin" or a prepared folder) against the run.

    Reads only `index.json`, so the service can call it for a folder on the shared
    filesystem, and every worker rank before its first collective.
    """
    if data == BUILTIN_DATA:
        # Packed on demand by the worker, so no index to read yet: what it will hold is known.
        builtin = DatasetIndex(
            format=1,
            dtype="uint8",
            vocab=BUILTIN_VOCAB,
            num_tokens=0,
            sha256="",
            source="builtin",
            shards=(),
        )
        return dataset_problems(builtin, model, None, eval_every)
    try:
        index = read_dataset_index(Path(data))
    except DatasetIndexError as exc:
        return [DatasetProblem("data", str(exc))]
    return dataset_problems(index, model, seq_len, eval_every)
