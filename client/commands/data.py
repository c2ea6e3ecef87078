"""`runyard data prepare`: tokenize your own corpus into token shards a run can train on.

Runs locally, like `runyard plan` (no service): the work is CPU-bound tokenizing on this
machine's cores, and the output folder is what a run spec's `data:` names.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from client.output import Exit, console, err_console, fail, hint, print_json

app = typer.Typer(help="Prepare training data (tokenize a corpus into token shards).")


def _progress_bar() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("units  {task.fields[tokens]:,} tokens  {task.fields[rate]:,.0f} tok/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,  # stdout stays for --json
        transient=False,
    )


@app.command()
def prepare(
    sources: list[Path] = typer.Argument(
        ...,
        help=".txt (one document each), .jsonl, .parquet files, folders of them, or a "
        "folder saved with datasets' save_to_disk.",
    ),
    tokenizer: Path = typer.Option(
        ..., help="A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json)."
    ),
    out: Path = typer.Option(..., help="Output folder (empty, or an interrupted prepare)."),
    text_field: str = typer.Option("text", help="The text column of .jsonl/.parquet/datasets."),
    val_fraction: float = typer.Option(0.005, help="Share of documents held out to validate."),
    workers: int | None = typer.Option(None, min=1, help="Processes (default: all cores)."),
    eos_token: str | None = typer.Option(None, help="Override the folder's eos_token."),
    seed: int = typer.Option(0, help="Seed of the held-out draw."),
    json_out: bool = typer.Option(False, "--json", help="Print the index as JSON."),
) -> None:
    """Tokenize SOURCES into token shards with a held-out split; resumes if interrupted."""
    from worker.data_prepare import PrepareError, PrepareProgress, PrepareSettings, prepare_dataset

    settings = PrepareSettings(
        text_field=text_field, val_fraction=val_fraction, seed=seed, eos_token=eos_token
    )
    start = time.perf_counter()
    bar = _progress_bar()
    task: TaskID | None = None

    def show(progress: PrepareProgress) -> None:
        nonlocal task
        if task is None:  # the bar appears once the inputs are planned, not before an error
            bar.start()
            what = "resuming" if progress.resumed else "tokenizing"
            task = bar.add_task(what, total=progress.num_units, tokens=0, rate=0.0)
        rate = progress.tokens / max(time.perf_counter() - start, 1e-9)
        bar.update(task, completed=progress.units_done, tokens=progress.tokens, rate=rate)

    def close_bar(keep: bool) -> None:
        if task is not None:  # started
            bar.live.transient = not keep
            bar.stop()

    try:
        index = prepare_dataset(sources, tokenizer, out, settings, workers, show)
    except PrepareError as exc:
        close_bar(keep=False)  # the error alone, on one line
        fail(str(exc), Exit.USAGE)
    except KeyboardInterrupt:
        close_bar(keep=True)  # shows how far it got
        fail(f"interrupted: run the same command again to resume into {out}", Exit.ERROR)
    close_bar(keep=True)
    if json_out:
        print_json(index.model_dump(mode="json"))
        return
    held_out = index.validation.num_tokens if index.validation else 0
    console.print(
        f"prepared {out}: {index.num_tokens:,} training tokens ({index.num_documents:,} "
        f"documents), {held_out:,} held out, {index.dtype}, vocab {index.vocab:,}",
        highlight=False,
        soft_wrap=True,
    )
    hint(f"name it in a run spec: data: {out.resolve()} (with model.vocab >= {index.vocab})")
