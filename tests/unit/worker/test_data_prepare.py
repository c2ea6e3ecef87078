"""`runyard data prepare`: real tokenizers (trained here) on real text, every input kind,
document boundaries, the held-out split, uint32 for Llama 3's vocabulary, resuming after an
interrupt (Ctrl-C and SIGKILL) to the very tokens of an uninterrupted prepare, and one-line
errors for files that are not what they claim to be."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from worker_helpers import clean_env

from contract import ModelShape, dataset_problems, read_dataset_index
from tests.fixtures.tokenizer_folders import EOS, LLAMA3_VOCAB, train_bpe_folder, wide_vocab_folder
from worker.data import TokenStream
from worker.data_prepare import PrepareError, PrepareSettings, prepare_dataset
from worker.data_prepare.prepare import FAULT_ENV

pytest.importorskip("tokenizers")
REPO_ROOT = Path(__file__).resolve().parents[3]
SMALL_UNITS = 20_000  # bytes of input per unit: the corpus below makes ~12 units


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """40 real documents: standard-library modules' sources under 12 KB each (~250 KB)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    small = [p for p in sorted(root.glob("*.py")) if p.stat().st_size < 12_000]
    return [p.read_text() for p in small[:40]]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory, texts: list[str]) -> Path:
    return train_bpe_folder(tmp_path_factory.mktemp("tok") / "bpe-512", texts, vocab_size=512)


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def documents(folder: Path, split: str, eos_id: int) -> list[np.ndarray]:
    """A split's token stream cut at every EOS (which ends each document)."""
    stream = TokenStream(folder, split).read(0, TokenStream(folder, split).num_tokens)
    assert stream[-1] == eos_id, "the stream ends with a document's EOS"
    return np.split(stream, np.flatnonzero(stream == eos_id) + 1)[:-1]


def test_documents_end_with_eos_and_every_document_lands_in_one_split(
    tmp_path: Path, texts: list[str], tokenizer_dir: Path
) -> None:
    from tokenizers import Tokenizer

    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    settings = PrepareSettings(val_fraction=0.1, unit_bytes=SMALL_UNITS, shard_tokens=50_000)
    index = prepare_dataset([source], tokenizer_dir, tmp_path / "out", settings, num_workers=2)
    assert index.format == 2 and index.dtype == "uint16" and index.vocab == 512
    assert index.tokenizer is not None and index.tokenizer.eos_token == EOS
    assert len(index.shards) > 1, "several shards, to read across their boundaries"
    assert read_dataset_index(tmp_path / "out") == index  # index.json is what it returned
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    eos = index.tokenizer.eos_id
    train = documents(tmp_path / "out", "train", eos)
    held_out = documents(tmp_path / "out", "validation", eos)
    assert index.validation is not None
    assert (len(train), len(held_out)) == (index.num_documents, index.validation.num_documents)
    assert 1 <= len(held_out) < len(texts) // 2
    decoded = [tokenizer.decode(d[:-1].tolist()) for d in train + held_out]
    assert sorted(decoded) == sorted(texts), "each document once, whole, in one split"
    in_order = [t for t in texts if t in set(decoded[: len(train)])]
    assert decoded[: len(train)] == in_order, "training documents keep the input order"


def test_every_input_kind_gives_the_same_tokens(
    tmp_path: Path, texts: list[str], tokenizer_dir: Path
) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = texts[:12]
    text_dir = tmp_path / "txt"
    text_dir.mkdir()
    for i, text in enumerate(docs):
        (text_dir / f"doc_{i:03d}.txt").write_text(text)
    table = pa.table({"text": docs})
    pq.write_table(table, tmp_path / "corpus.parquet", row_group_size=5)
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(str(tmp_path / "saved"))
    inputs = {
        "txt": text_dir,
        "jsonl": write_jsonl(tmp_path / "corpus.jsonl", docs),
        "parquet": tmp_path / "corpus.parquet",
        "hf_dataset": tmp_path / "saved",
    }
    settings = PrepareSettings(val_fraction=0.0, unit_bytes=SMALL_UNITS)
    digests = {
        kind: prepare_dataset([path], tokenizer_dir, tmp_path / f"out-{kind}", settings, 1).sha256
        for kind, path in inputs.items()
    }
    assert len(set(digests.values())) == 1, digests


def test_llama3_sized_vocabulary_makes_uint32_shards(tmp_path: Path) -> None:
    tokenizer = wide_vocab_folder(tmp_path / "wide")
    source = write_jsonl(tmp_path / "c.jsonl", ["the cat of the hat", "a dog and a fox", "in it"])
    index = prepare_dataset([source], tokenizer, tmp_path / "out", PrepareSettings(), 1)
    assert (index.vocab, index.dtype) == (LLAMA3_VOCAB, "uint32")
    tokens = np.fromfile(tmp_path / "out" / index.shards[0].file, dtype=np.uint32)
    assert tokens.max() == LLAMA3_VOCAB - 1, "the EOS id, above uint16's range, survives"
    assert index.tokenizer is not None and index.tokenizer.eos_id == LLAMA3_VOCAB - 1
    llama3_8b = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128_256)
    assert dataset_problems(index, llama3_8b, seq_len=4) == []
    small = llama3_8b.model_copy(update={"vocab": 32_000})
    assert [p.field for p in dataset_problems(index, small)] == ["model.vocab"]


def test_parallel_prepare_equals_serial(
    tmp_path: Path, texts: list[str], tokenizer_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    settings = PrepareSettings(val_fraction=0.05, unit_bytes=SMALL_UNITS)
    serial = prepare_dataset([source], tokenizer_dir, tmp_path / "one", settings, num_workers=1)
    parallel = prepare_dataset([source], tokenizer_dir, tmp_path / "two", settings, num_workers=2)
    assert serial.model_dump(exclude={"source"}) == parallel.model_dump(exclude={"source"})


def test_ctrl_c_then_resume_gives_the_uninterrupted_tokens(
    tmp_path: Path, texts: list[str], tokenizer_dir: Path
) -> None:
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    settings = PrepareSettings(val_fraction=0.05, unit_bytes=SMALL_UNITS, shard_tokens=30_000)
    reference = prepare_dataset([source], tokenizer_dir, tmp_path / "whole", settings, 2)

    def interrupt_after_four(progress) -> None:
        if progress.units_done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare_dataset(
            [source], tokenizer_dir, tmp_path / "out", settings, 2, interrupt_after_four
        )
    assert not (tmp_path / "out" / "index.json").exists()
    seen = []
    resumed = prepare_dataset([source], tokenizer_dir, tmp_path / "out", settings, 2, seen.append)
    assert seen[0].resumed and seen[0].units_skipped == 4
    assert resumed.model_dump(exclude={"source"}) == reference.model_dump(exclude={"source"})


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "runyard"), "data", "prepare", *args]
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env or clean_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.heavy  # a process killed and run again: 5-7 s, make test-all
def test_sigkill_between_shards_and_journal_then_resume(
    tmp_path: Path, texts: list[str], tokenizer_dir: Path
) -> None:
    """Killed after unit 3's tokens reached the shards but before the journal named them:
    the resume must cut them off and write them again exactly once."""
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    reference = prepare_dataset([source], tokenizer_dir, tmp_path / "whole", PrepareSettings(), 2)
    args = [str(source), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "out")]
    args += ["--workers", "2"]
    killed = _cli(*args, env=clean_env(**{FAULT_ENV: "kill_before_journal:0"}))
    assert killed.returncode == -9, killed.stderr
    shard = tmp_path / "out" / "shard_00000.bin"
    assert shard.stat().st_size > 0, "unit 0's tokens were on disk when it died"
    journal = tmp_path / "out" / ".prepare" / "journal.jsonl"
    assert not journal.exists() or journal.read_text() == "", "the journal did not name them"
    finished = _cli(*args, "--json")
    assert finished.returncode == 0, finished.stderr
    index = json.loads(finished.stdout)
    assert (index["sha256"], index["num_tokens"]) == (reference.sha256, reference.num_tokens)
    assert reference.validation is not None
    assert index["validation"] == reference.validation.model_dump(mode="json")


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("latin1.txt", "caf\xe9".encode("latin-1"), "not UTF-8 text"),
        ("broken.jsonl", b'{"text": "fine"}\n{"text": oops}\n', "not a JSON line"),
        ("fields.jsonl", b'{"body": "no text field"}\n', "no string field 'text'"),
        ("fake.parquet", b"PAR1 this is not parquet", "not a Parquet file"),
        ("notes.md", b"# notes", "unsupported input"),
    ],
)
def test_a_file_that_is_not_what_it_claims_is_a_one_line_error(
    tmp_path: Path, tokenizer_dir: Path, name: str, content: bytes, message: str
) -> None:
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "out"
    result = _cli(str(tmp_path / name), "--tokenizer", str(tokenizer_dir), "--out", str(out))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert message in lines[0] and name in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    if name.endswith(".jsonl"):  # found while tokenizing: fixed, the same command goes on
        (tmp_path / name).write_text(json.dumps({"text": "the fixed text"}) + "\n")
        fixed = _cli(str(tmp_path / name), "--tokenizer", str(tokenizer_dir), "--out", str(out))
        assert fixed.returncode == 0, fixed.stderr


def test_refusals_before_any_work(tmp_path: Path, texts: list[str], tokenizer_dir: Path) -> None:
    source = write_jsonl(tmp_path / "corpus.jsonl", texts[:3])
    with pytest.raises(PrepareError, match=r"no tokenizer\.json"):
        prepare_dataset([source], tmp_path, tmp_path / "out")
    prepare_dataset([source], tokenizer_dir, tmp_path / "out", PrepareSettings(), 1)
    other = PrepareSettings(val_fraction=0.2)
    with pytest.raises(PrepareError, match="other inputs, tokenizer or settings"):
        prepare_dataset([source], tokenizer_dir, tmp_path / "out", other, 1)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    with pytest.raises(PrepareError, match="not empty"):
        prepare_dataset([source], tokenizer_dir, tmp_path / "busy", PrepareSettings(), 1)
    (tmp_path / "held" / ".prepare").mkdir(parents=True)
    with open(tmp_path / "held" / ".prepare" / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a prepare still running there holds it
        with pytest.raises(PrepareError, match="another prepare is writing there"):
            prepare_dataset([source], tokenizer_dir, tmp_path / "held", PrepareSettings(), 1)
    with pytest.raises(PrepareError, match="--val-fraction"):
        prepare_dataset([source], tokenizer_dir, tmp_path / "x", PrepareSettings(val_fraction=1))
    assert os.listdir(tmp_path / "busy") == ["mine.txt"]
