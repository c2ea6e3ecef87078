"""`runyard plan`: the best layout for a model on N GPUs, computed locally (no service).

The planner is pure Python, so this command imports it directly: it works on a laptop
with no service running and prints exactly what the service would decide.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, NoReturn

import typer
from pydantic import ValidationError

from client.commands.plan_history import accuracy as accuracy_report
from client.commands.plan_history import cluster_calibration
from client.output import Exit, console, fail, print_json, print_table
from contract import ModelShape
from planner.blocks import BlockPlan, block_plan
from planner.explain import StepCause, explain_plan
from planner.layout import Layout
from planner.plan import PlanError
from planner.plan import plan as plan_run
from planner.presets import MODEL_PRESETS

SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "mlp")


def model_shape(model: str | None, overrides: dict[str, Any]) -> ModelShape:
    """A preset, an explicit shape, or a preset with some fields replaced."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if model is not None:
        if model not in MODEL_PRESETS:
            fail(
                f"unknown model {model!r}; known: {', '.join(MODEL_PRESETS)} "
                "(or give --layers --hidden --heads --ffn --vocab)",
                Exit.USAGE,
            )
        base = MODEL_PRESETS[model].model_dump()
    else:
        missing = [
            f"--{k}" for k in ("layers", "hidden", "heads", "ffn", "vocab") if k not in given
        ]
        if missing:
            fail(f"give --model or a full shape (missing {' '.join(missing)})", Exit.USAGE)
        base = {"kv_heads": given["heads"]}
    try:
        return ModelShape(**{**base, **given})
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"model shape: {first['msg']}", Exit.USAGE)


def plan(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help=f"Preset: {', '.join(MODEL_PRESETS)}."),
    gpus: int | None = typer.Option(None, help="GPUs for the run (required)."),
    seq: int | None = typer.Option(None, help="Tokens per sequence (required)."),
    global_batch_tokens: int | None = typer.Option(
        None, help="Tokens per optimizer step (required)."
    ),
    precision: str = typer.Option("bf16", help="bf16 or fp8."),
    hardware: str = typer.Option("h100-sxm", help="h100-sxm, h200 or a100-80gb."),
    network: str = typer.Option("ib", help="ib or efa."),
    gpus_per_node: int = typer.Option(8, help="GPUs per node (one NVLink domain)."),
    dp: int | None = typer.Option(None, help="Pin data-parallel degree."),
    tp: int | None = typer.Option(None, help="Pin tensor-parallel degree."),
    pp: int | None = typer.Option(None, help="Pin pipeline stages."),
    cp: int | None = typer.Option(None, help="Pin context-parallel degree."),
    zero: int | None = typer.Option(None, help="Pin ZeRO stage (0-3)."),
    micro_batch: int | None = typer.Option(None, help="Pin micro batch size."),
    recompute: str | None = typer.Option(None, help="Pin none, selective or full."),
    vp: int | None = typer.Option(None, help="Pin virtual stages per pipeline rank."),
    layers: int | None = typer.Option(None, help="Shape: transformer blocks."),
    hidden: int | None = typer.Option(None, help="Shape: model width."),
    heads: int | None = typer.Option(None, help="Shape: query heads."),
    kv_heads: int | None = typer.Option(None, help="Shape: key/value heads (default: heads)."),
    ffn: int | None = typer.Option(None, help="Shape: MLP inner width."),
    vocab: int | None = typer.Option(None, help="Shape: vocabulary size."),
    mlp: str | None = typer.Option(None, help="Shape: swiglu or gelu."),
    replica_groups: str = typer.Option(
        "auto",
        help="Replica groups for the fast recovery path: auto (the planner chooses them with "
        "the layout), 1 (none), or a count, as a spec's fault_tolerance asks.",
    ),
    json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    explain: bool = typer.Option(
        False, "--explain", help="Also print where the best layout's step time goes, and why."
    ),
    uncalibrated: bool = typer.Option(
        False,
        "--uncalibrated",
        help="Plan from the published figures alone, without the cluster's corrections "
        "from its own measured runs (which the service is asked for otherwise).",
    ),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        min=1,
        help="Nodes per block on a topology/block cluster (an NVL72 rack: 18 nodes of 4 "
        "GPUs): also print the blocks the run spans and the --segment it asks for.",
    ),
) -> None:
    """Plan a run: the fastest layout that fits, its memory, speed and failure budget.

    `runyard plan accuracy` shows how right past plans were on this cluster."""
    if ctx.invoked_subcommand is not None:
        return
    if gpus is None or seq is None or global_batch_tokens is None:
        fail("give --gpus, --seq and --global-batch-tokens (or: runyard plan accuracy)", Exit.USAGE)
    shape = _shape_from_options(model, layers, hidden, heads, kv_heads, ffn, vocab, mlp)
    pinned = _pinned_layout(dp, tp, pp, cp, zero, micro_batch, recompute, vp)
    groups = _replica_groups(replica_groups)
    calibration, calibration_note = cluster_calibration(hardware, uncalibrated)
    try:
        result = plan_run(
            shape,
            hardware,
            gpus,
            seq,
            global_batch_tokens,
            precision,
            network,
            pinned,
            gpus_per_node,
            replica_groups=groups,
            calibration=calibration,
        ).model_dump()
    except PlanError as exc:
        _fail_with(exc)
    causes = _step_causes(shape, result) if explain else None
    blocks = _blocks(result, gpus // gpus_per_node, block_size) if block_size else None
    _print_result(result, calibration_note, blocks, causes, json)


def _shape_from_options(
    model: str | None,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    kv_heads: int | None,
    ffn: int | None,
    vocab: int | None,
    mlp: str | None,
) -> ModelShape:
    """The model shape that --model and the shape options give (model_shape). --mlp is
    checked first, so that a wrong value's error names the option."""
    if mlp is not None and mlp not in ("swiglu", "gelu"):
        fail(f"--mlp must be swiglu or gelu, not {mlp!r}", Exit.USAGE)
    return model_shape(
        model,
        dict(zip(SHAPE_FIELDS, (layers, hidden, heads, kv_heads, ffn, vocab, mlp), strict=True)),
    )


def _pinned_layout(
    dp: int | None,
    tp: int | None,
    pp: int | None,
    cp: int | None,
    zero: int | None,
    micro_batch: int | None,
    recompute: str | None,
    vp: int | None,
) -> dict[str, Any]:
    """The pin options under the layout's field names, as the planner takes them (None:
    the planner chooses)."""
    return {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "zero_stage": zero,
        "micro_batch_size": micro_batch,
        "recompute": recompute,
        "vp": vp,
    }


def _fail_with(exc: PlanError) -> NoReturn:
    """One line naming the field at fault; a plan that cannot be had as asked (the error
    carries advice) exits as an error, a bad option as a usage error."""
    named = exc.message if exc.message.startswith(exc.field) else str(exc)
    fail(named, Exit.ERROR if exc.advice else Exit.USAGE)


def _print_result(
    result: dict[str, Any],
    calibration_note: str,
    blocks: BlockPlan | None,
    causes: list[StepCause] | None,
    as_json: bool,
) -> None:
    """The plan as one JSON object (the blocks and the step's causes in it, if asked for),
    or for people: the plan, where its calibration came from, then the blocks and causes."""
    if blocks is not None:
        result["blocks"] = asdict(blocks) | {"fits_in_blocks": blocks.fits_in_blocks}
    if as_json:
        if causes is not None:
            result["step_explained"] = [
                {"cause": c.cause, "seconds": c.seconds, "why": c.why} for c in causes
            ]
        print_json(result)
        return
    print_plan(result)
    console.print(calibration_note, highlight=False)
    if blocks is not None:
        console.print(blocks.describe())
    if causes is not None:
        print_explanation(causes, result["step_time_s"])


def _blocks(result: dict[str, Any], num_nodes: int, block_size: int) -> BlockPlan:
    """How the chosen layout sits on blocks of `block_size` nodes (planner/blocks.py)."""
    chosen, per_node = result["layout"], result["gpus_per_node"]
    return block_plan(
        num_nodes,
        tp=chosen["tp"],
        cp=chosen["cp"],
        pp=chosen["pp"],
        gpus_per_node=per_node,
        block_size=block_size,
    )


def _replica_groups(value: str) -> int | None:
    """--replica-groups: None for auto, else a count of at least 1."""
    if value == "auto":
        return None
    if not value.isdigit() or int(value) < 1:
        fail(f"--replica-groups must be auto or a count of at least 1, not {value!r}", Exit.USAGE)
    return int(value)


def _step_causes(shape: ModelShape, result: dict[str, Any]) -> list[StepCause]:
    """The planner's own breakdown of the chosen layout's step, cause by cause."""
    chosen = result["layout"]
    layout = Layout(
        dp=chosen["dp"],
        tp=chosen["tp"],
        pp=chosen["pp"],
        cp=chosen["cp"],
        zero_stage=chosen["zero_stage"],
        micro_batch_size=chosen["micro_batch_size"],
        recompute=chosen["recompute"],
        precision=chosen["precision"],
        vp=chosen["vp"],
    )
    return explain_plan(
        shape,
        result["hardware"],
        result["network"],
        result["gpus_per_node"],
        layout,
        result["seq_len"],
        chosen["grad_accum"],
    )


def print_explanation(causes: list[StepCause], step_time_s: float) -> None:
    """Where one step's time goes, largest cause first, with the model's reason for each."""
    shown = sorted((c for c in causes if c.seconds > 0), key=lambda c: -c.seconds)
    print_table(
        f"where a {step_time_s:.2f} s step goes",
        ["CAUSE", "SECONDS", "SHARE", "WHY"],
        [(c.cause, f"{c.seconds:.3f}", f"{c.seconds / step_time_s:.1%}", c.why) for c in shown],
    )


def _layout_text(layout: dict[str, Any]) -> str:
    return (
        f"dp={layout['dp']} tp={layout['tp']} pp={layout['pp']} cp={layout['cp']} "
        f"vp={layout['vp']} zero={layout['zero_stage']} mb={layout['micro_batch_size']} "
        f"accum={layout['grad_accum']} recompute={layout['recompute']} "
        f"{layout['precision']}"
    )


def print_plan(result: dict[str, Any]) -> None:
    """The plan for people: the best layout, its numbers, the runners-up, the rejections."""
    mem, ckpt = result["memory_gib_per_gpu"], result["checkpoint"]
    console.print(f"[bold]best[/bold] {_layout_text(result['layout'])}", highlight=False)
    console.print(
        f"step {result['step_time_s']:.2f} s  {result['tokens_per_s']:,.0f} tok/s "
        f"({result['tokens_per_s_per_gpu']:,.0f} per GPU)  MFU {result['mfu']:.1%}  "
        f"{result['tflops_per_gpu']:.0f} TFLOP/s per GPU",
        highlight=False,
    )
    console.print(
        f"memory {mem['total']:.1f} of {mem['capacity']:.1f} GiB per GPU: params "
        f"{mem['params']:.1f}, grads {mem['grads']:.1f}, optimizer {mem['optimizer']:.1f}, "
        f"activations {mem['activations']:.1f}, overhead {mem['overhead']:.1f}",
        highlight=False,
    )
    parts = ", ".join(
        f"{k.removesuffix('_s')} {v:.2f}"
        for k, v in result["step_breakdown_s"].items()
        if v >= 0.005
    )
    console.print(f"step time: {parts}", highlight=False)
    console.print(
        f"failures: one every {result['mtbi_h']:.1f} h; checkpoint {ckpt['size_gib']:,.0f} GiB "
        f"written in {ckpt['write_s']:.1f} s every {ckpt['interval_steps']} steps "
        f"({ckpt['interval_s'] / 60:.1f} min); goodput {result['goodput']:.1%}; "
        f"{result['spare_nodes']} spare nodes",
        highlight=False,
    )
    lost = result.get("lost_s_per_interruption") or {}
    if result.get("goodput_fast") is None:
        # No fast-path figure for a run the service would not split into replica groups.
        # The planner says why when it chose; otherwise one group was asked for.
        why = result.get("no_groups_because") or "a count of 1 was asked for"
        console.print(
            f"recovery: classic path only (restart from disk): no replica groups: {why}",
            highlight=False,
        )
    else:
        fast_steps = ckpt.get("fast_interval_steps")
        fast_every = (
            f"checkpoint every {fast_steps} steps ({ckpt['fast_interval_s'] / 60:.1f} min)"
            if fast_steps is not None
            else "checkpoint interval unknown (an older service)"
        )
        console.print(
            f"recovery: classic path (restart from disk) goodput {result['goodput']:.1%}, "
            f"{lost.get('classic', 0) / 60:.1f} min lost per failure, checkpoint every "
            f"{ckpt['interval_steps']} steps ({ckpt['interval_s'] / 60:.1f} min); fast path "
            f"({result['fast_replica_groups']} replica groups) goodput "
            f"{result['goodput_fast']:.1%}, {lost.get('fast', 0):.0f} s lost per failure, "
            f"{fast_every}",
            highlight=False,
        )
    print_table(
        "runners-up",
        ["LAYOUT", "STEP S", "TOK/S", "MFU", "GIB/GPU"],
        [
            (
                _layout_text(r["layout"]),
                f"{r['step_time_s']:.2f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['mfu']:.1%}",
                f"{r['memory_gib_per_gpu']:.1f}",
            )
            for r in result["runners_up"]
        ],
    )
    examples = result["rejected_examples"]
    print_table(
        "rejected",
        ["REASON", "LAYOUTS", "FOR EXAMPLE"],
        [
            (reason, f"{count:,}", examples.get(reason, ""))
            for reason, count in sorted(result["rejected"].items(), key=lambda kv: -kv[1])
        ],
    )


def accuracy(
    limit: int = typer.Option(200, min=1, max=1000, help="The newest runs to show."),
    json: bool = typer.Option(False, "--json", help="Print the report as one JSON object."),
) -> None:
    """Predicted against measured for this cluster's runs (step time, tokens/s per GPU, MFU,
    checkpoint stall, restart), and the step-time error per model size and layout family."""
    accuracy_report(limit, json)


app = typer.Typer(help="Plan a run, or see how right past plans were on this cluster.")
app.callback(invoke_without_command=True)(plan)
app.command(name="accuracy")(accuracy)
