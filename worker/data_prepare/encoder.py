"""A Hugging Face tokenizer folder, and turning one unit's documents into token arrays.

A folder saved by `tokenizers` or by a `transformers` fast tokenizer holds `tokenizer.json`
(the whole model: normalizer, pre-tokenizer, BPE merges, added tokens); the end-of-text
token comes from `tokenizer_config.json` or `special_tokens_map.json` beside it.
Each pool process loads the tokenizer once and encodes its units single-threaded: the pool
is the parallelism, and a Rust thread pool per process would only fight it for the cores.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.dataset import TokenizerIdentity, dtype_for_vocab

from .errors import PrepareError
from .sources import Unit, read_documents

TOKENIZER_FILE = "tokenizer.json"
_EOS_FILES = ("tokenizer_config.json", "special_tokens_map.json")
PARENT_POLL_S = 0.5


def _eos_from_configs(folder: Path) -> str | None:
    for name in _EOS_FILES:
        path = folder / name
        if not path.exists():
            continue
        try:
            eos = json.loads(path.read_text()).get("eos_token")
        except (OSError, ValueError, AttributeError) as exc:
            raise PrepareError(f"{path}: not a JSON object ({exc})") from None
        if isinstance(eos, dict):  # transformers' AddedToken form
            eos = eos.get("content")
        if isinstance(eos, str):
            return eos
    return None


def load_tokenizer(folder: Path, eos_token: str | None = None) -> tuple[Any, TokenizerIdentity]:
    """The tokenizer in `folder` and its identity; `eos_token` overrides the folder's."""
    from tokenizers import Tokenizer

    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise PrepareError(
            f"{folder}: no {TOKENIZER_FILE} (a fast tokenizer folder: with transformers, "
            "AutoTokenizer.from_pretrained(...).save_pretrained(folder) writes one)"
        )
    data = path.read_bytes()
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise PrepareError(f"{path}: not a tokenizers model ({exc})") from None
    eos = eos_token or _eos_from_configs(folder)
    if eos is None:
        raise PrepareError(f"{folder}: no eos_token in {' or '.join(_EOS_FILES)}; give --eos-token")
    eos_id = tokenizer.token_to_id(eos)
    if eos_id is None:
        raise PrepareError(f"{folder}: the end-of-text token {eos!r} is not in the vocabulary")
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    vocab = max(tokenizer.get_vocab_size(with_added_tokens=True), max(ids) + 1)
    identity = TokenizerIdentity(
        name=folder.resolve().name,
        sha256=hashlib.sha256(data).hexdigest(),
        vocab=vocab,
        eos_id=eos_id,
        eos_token=eos,
    )
    return tokenizer, identity


@dataclass(frozen=True)
class EncoderSettings:
    """What every pool process needs besides the unit (sent once, at its start)."""

    tokenizer_dir: str
    eos_token: str
    text_field: str
    val_fraction: float
    seed: int
    num_units: int


@dataclass(frozen=True)
class EncodedUnit:
    """One unit's tokens, each document followed by EOS, split into training and held out."""

    number: int
    train: np.ndarray
    validation: np.ndarray
    num_documents: int
    num_validation_documents: int
    num_chars: int


_state: dict[str, Any] = {}  # this pool process's tokenizer and settings


def _exit_with_parent(parent: int) -> None:
    """A pool process whose prepare was killed (SIGKILL, OOM) would wait for work forever."""
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def start_process(settings: EncoderSettings) -> None:
    """Pool initializer: one core per process (see the module doc), die with the prepare."""
    threading.Thread(
        target=_exit_with_parent, args=(os.getppid(),), name="parent-watch", daemon=True
    ).start()
    # Ctrl-C reaches the whole process group: the prepare itself stops the pool, in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    load_encoder(settings)


def load_encoder(settings: EncoderSettings) -> None:
    """Load the tokenizer for encode_unit, once per process."""
    tokenizer, identity = load_tokenizer(Path(settings.tokenizer_dir), settings.eos_token)
    # A post-processor that already ends each document with EOS (T5-style) needs no second.
    probe = tokenizer.encode("a", add_special_tokens=True).ids
    _state.update(
        tokenizer=tokenizer,
        identity=identity,
        settings=settings,
        dtype=np.dtype(dtype_for_vocab(identity.vocab)),
        appends_eos=not (probe and probe[-1] == identity.eos_id),
    )


def held_out(settings: EncoderSettings, number: int, num_documents: int) -> np.ndarray:
    """Which documents of unit `number` go to the validation split: a seeded draw per unit,
    so the choice depends on the inputs alone (not on the pool, the order units finish in,
    or an interrupt). The first document of the corpus is always held out when there is a
    second, so that a small corpus still has a validation split."""
    draws = np.random.default_rng([settings.seed, number]).random(num_documents)
    chosen = draws < settings.val_fraction
    if number == 0 and num_documents and settings.val_fraction > 0:
        chosen[0] = num_documents > 1 or settings.num_units > 1
    return chosen


def _pack(ids: list[list[int]], eos_id: int | None, dtype: np.dtype) -> np.ndarray:
    """Documents' ids end to end, each followed by `eos_id` (when given), as one array."""
    if not ids:
        return np.zeros(0, dtype)
    lengths = np.fromiter((len(d) for d in ids), np.int64, len(ids))
    extra = 0 if eos_id is None else 1
    flat = np.empty(int(lengths.sum()) + extra * len(ids), dtype)
    position = 0
    for document, length in zip(ids, lengths.tolist(), strict=True):
        flat[position : position + length] = document
        position += length
        if eos_id is not None:
            flat[position] = eos_id
            position += 1
    return flat


def encode_unit(number: int, unit: Unit) -> EncodedUnit:
    """Read, tokenize and split one unit (runs in a pool process)."""
    settings: EncoderSettings = _state["settings"]
    tokenizer = _state["tokenizer"]
    documents = read_documents(unit, settings.text_field)
    # encode_batch_fast skips the character offsets, which shards do not keep.
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    ids = [e.ids for e in encode(documents, add_special_tokens=True)]
    eos = _state["identity"].eos_id if _state["appends_eos"] else None
    chosen = held_out(settings, number, len(ids))
    train = [d for d, held in zip(ids, chosen, strict=True) if not held]
    validation = [d for d, held in zip(ids, chosen, strict=True) if held]
    return EncodedUnit(
        number=number,
        train=_pack(train, eos, _state["dtype"]),
        validation=_pack(validation, eos, _state["dtype"]),
        num_documents=len(train),
        num_validation_documents=len(validation),
        num_chars=sum(len(d) for d in documents),
    )
