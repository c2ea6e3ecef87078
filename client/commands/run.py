"""`runyard run ...`: submit, list, show, cancel, checkpoints, events, watch, logs, report,
export."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
import yaml

from client.commands.common import call, fmt_float
from client.commands.sweep import print_sweep
from client.live.logs import show_logs
from client.live.watch import watch_run
from client.output import Exit, console, fail, hint, print_json, print_table, short_time

app = typer.Typer(help="Training runs.", no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


def load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", Exit.USAGE)
    except yaml.YAMLError as exc:
        fail(f"{path} is not valid YAML: {exc}", Exit.USAGE)
    if not isinstance(spec, dict):
        fail(f"{path} must hold a mapping of run spec fields (name, model, nodes, ...)", Exit.USAGE)
    return spec


DRY_RUN = typer.Option(
    False, "--dry-run", help="Show the layout and plan the service would choose; submit nothing."
)


def layout_text(layout: dict[str, Any]) -> str:
    """One line for the layout a run trains with."""
    vp = f" vp={layout['vp']}" if layout.get("vp", 1) > 1 else ""
    return (
        f"dp={layout['dp']} tp={layout['tp']} pp={layout['pp']}{vp} cp={layout['cp']} "
        f"zero={layout['zero_stage']} micro_batch={layout['micro_batch_size']} "
        f"recompute={layout['recompute']} {layout['precision']}"
    )


def plan_text(plan: dict[str, Any]) -> str:
    """One line for the planner's figures of that layout on the cluster's GPUs."""
    return (
        f"plan on {plan['num_gpus']} x {plan['hardware']}: "
        f"{plan['memory_gib_per_gpu']['total']:.1f} GiB/GPU, step {plan['step_time_s']:.3f} s, "
        f"MFU {plan['mfu']:.1%}, checkpoint every {plan['checkpoint']['interval_steps']} steps"
    )


def print_decision(decision: dict[str, Any]) -> None:
    pinned = ", ".join(decision["pinned"]) or "nothing (parallelism: auto)"
    console.print(f"{decision['world_size']} ranks; pinned: {pinned}")
    console.print(f"layout {layout_text(decision['layout'])}")
    groups = decision.get("replica_groups", 1)
    why = decision["plan"].get("no_groups_because")
    console.print(
        f"replica groups: {groups} (fast recovery: a failed node's group heals from a peer)"
        if groups > 1
        else "replica groups: none (classic recovery: restart from the last checkpoint)"
        + (f"; fault_tolerance auto: {why}" if why else ""),
        highlight=False,
    )
    console.print(plan_text(decision["plan"]))
    if decision.get("clusters"):
        print_cluster_plans(decision)
    if (python := decision.get("environment")) is not None:  # as the run's owner ran it
        console.print(
            f"python: {python['python']} (Python {python['python_version']}, torch "
            f"{python['torch_version']}, runyard_client protocol {python['client_protocol']})",
            highlight=False,
            soft_wrap=True,  # a path is not cut
        )


def print_cluster_plans(decision: dict[str, Any]) -> None:
    """Each cluster's plan for the spec as the placement rule weighed it, and why the chosen
    one won (service/clusters/choice.py)."""
    print_table(
        "clusters",
        ["CLUSTER", "GPU", "STEP S", "GOODPUT", "W/ SPARES", "SPARES", "FREE", "NOW", "S/STEP", ""],
        [
            (
                row["name"],
                row["hardware"],
                f"{row['step_time_s']:.3f}" if row["step_time_s"] else "-",
                f"{row['goodput']:.1%}" if row["step_time_s"] else "-",
                f"{row['expected_goodput']:.1%}" if row["step_time_s"] else "-",
                row["spares"],
                row["free_nodes"],
                "yes" if row["starts_now"] else "no",
                f"{row['time_per_step_s']:.3f}" if row["time_per_step_s"] is not None else "-",
                "chosen" if row["chosen"] else f"{row['unfit'] or ''} {row['why_unfit']}".strip(),
            )
            for row in decision["clusters"]
        ],
    )
    console.print(f"cluster {decision['cluster_why']}", highlight=False, soft_wrap=True)


@app.command()
def submit(
    file: Path = typer.Argument(..., help="Run spec (YAML)."),
    dry_run: bool = DRY_RUN,
    json: bool = JSON,
) -> None:
    """Submit a run from a YAML spec; a spec with a `sweep:` grid becomes one job array."""
    spec = load_spec(file)
    if "sweep" in spec:
        return _submit_sweep(spec, dry_run, json)
    if dry_run:
        decision = call(lambda c: c.dry_run_run(spec))
        if json:
            return print_json(decision)
        print_decision(decision)
        hint(f"runyard run submit {file}")
        return
    run = call(lambda c: c.submit_run(spec))
    if json:
        return print_json(run)
    console.print(
        f"run [bold]{run['id']}[/bold] '{run['name']}' accepted: {run['state']}, "
        f"{run['num_nodes']} nodes x {run['gpus_per_node']} ranks, "
        f"{layout_text(run['layout'])}"
    )
    hint(f"runyard run watch {run['id']}")


def _submit_sweep(spec: dict[str, Any], dry_run: bool, json: bool) -> None:
    if dry_run:
        decided = call(lambda c: c.dry_run_sweep(spec))
        if json:
            return print_json(decided)
        print_table(
            f"{len(decided['points'])} runs, at most {decided['max_parallel']} at once",
            ["POINT", "LAYOUT", "STEP S", "GIB/GPU"],
            [
                (
                    " ".join(f"{k}={v}" for k, v in p["params"].items()),
                    layout_text(p["decision"]["layout"]),
                    f"{p['decision']['plan']['step_time_s']:.3f}",
                    f"{p['decision']['plan']['memory_gib_per_gpu']['total']:.1f}",
                )
                for p in decided["points"]
            ],
        )
        return
    sweep = call(lambda c: c.submit_sweep(spec))
    if json:
        return print_json(sweep)
    print_sweep(sweep)
    hint(f"runyard sweep show {sweep['id']}")


@app.command("list")
def list_(
    state: str | None = typer.Option(None, help="Only runs in this state."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Only runs on this cluster (`runyard cluster list`)."
    ),
    json: bool = JSON,
) -> None:
    """Runs, newest first."""
    runs = call(lambda c: c.list_runs(state, cluster=cluster))
    if json:
        return print_json(runs)
    print_table(
        None,
        ["ID", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "RESTARTS", "CREATED"],
        [
            (
                r["id"],
                r["name"],
                r["state"],
                f"{r['last_step'] or 0}/{r['total_steps']}",
                fmt_float(r["last_loss"]),
                fmt_float(r["tokens_per_s"], 0),
                f"{r['num_restarts']}/{r['max_restarts']}",
                short_time(r["created_at"]),
            )
            for r in runs["items"]
        ],
    )


def topology_text(placement: dict[str, Any]) -> str:
    """Which blocks (topology/block) or leaf switches the run spans, each with its nodes,
    and the --segment its attempts ask for; empty for a placement recorded before."""
    groups: dict[str, str] = placement.get("groups") or {}
    if not groups:
        return ""
    spans = ", ".join(f"{name} {nodes}" for name, nodes in groups.items())
    if placement.get("topology") != "block":
        return f"leaf switches {spans}"
    segment = placement.get("segment")
    asked = f"--segment={segment}" if segment else "no segment: a replica is larger than a block"
    return f"blocks {spans} ({len(groups)} of {placement.get('block_size')} nodes; {asked})"


@app.command()
def show(run_id: int, json: bool = JSON) -> None:
    """One run and its attempts."""
    run = call(lambda c: c.get_run(run_id))
    if json:
        return print_json(run)
    console.print(
        f"[bold]run {run['id']}[/bold] {run['name']}: {run['state']} ({run['state_reason']})"
    )
    console.print(
        f"step {run['last_step'] or 0}/{run['total_steps']}  "
        f"loss {fmt_float(run['last_loss'])}  tok/s {fmt_float(run['tokens_per_s'], 0)}"
        f"  restarts {run['num_restarts']}/{run['max_restarts']}"
        + (f"  MFU {run['mfu']:.2%}" if run.get("mfu") is not None else "")
    )
    spec_layout = run["spec"].get("parallelism")
    pinned = (
        []
        if spec_layout in (None, "auto")
        else [k for k, v in spec_layout.items() if v is not None]
    )
    chosen = f"pinned {', '.join(sorted(pinned))}, the rest planned" if pinned else "planned"
    console.print(f"layout {layout_text(run['layout'])} ({chosen})")
    console.print(f"nodes {', '.join(run['nodes']) or '-'}")
    if (placed := run.get("placement")) and (where := topology_text(placed)):
        console.print(where)
    if run.get("sweep_id") is not None:
        point = " ".join(f"{k}={v}" for k, v in (run.get("sweep_params") or {}).items())
        console.print(f"sweep {run['sweep_id']}: {point}")
    if plan := run.get("plan"):
        console.print(plan_text(plan))
    if (goodput := run.get("goodput")) and goodput["goodput"] is not None:
        lost = goodput["lost"]
        console.print(
            f"goodput {goodput['goodput']:.1%} of {goodput['allocated_s']:.0f} s allocated "
            f"({goodput['allocated_gpu_hours']:.3f} GPU-h); lost: recomputed "
            f"{lost['recomputed_steps_s']:.1f} s, detection {lost['detection_s']:.1f} s, "
            f"drain+resubmit {lost['drain_and_resubmit_s']:.1f} s, start-up+load "
            f"{lost['startup_and_load_s']:.1f} s, checkpoint stalls "
            f"{lost['checkpoint_stalls_s']:.1f} s"
            + (f", rolled back {lost['rolled_back_s']:.1f} s" if lost.get("rolled_back_s") else "")
            + (
                f", cluster failover {lost['cluster_failover_s']:.1f} s"
                if lost.get("cluster_failover_s")
                else ""
            )
            + f"; queued {goodput['queued_s']:.1f} s"
        )
    for r in run.get("rollbacks") or []:  # past a loss spike, a non-finite value or an SDC
        if r.get("kind") == "sdc":
            console.print(
                f"rolled back (attempt {r['attempt']}): silent data corruption at step "
                f"{r['anomaly_step']} on {', '.join(r['nodes'])} (drained); resumed from step "
                f"{r['resume_step']}, the last clean comparison was at step {r['clean_step']}"
            )
            continue
        last = r["skip_from_step"] + r["skip_steps"] - 1
        console.print(
            f"rolled back (attempt {r['attempt']}): {r['message']}; resumed from step "
            f"{r['resume_step']}, data of steps {r['skip_from_step']}-{last} skipped"
        )
    print_table(
        "attempts",
        ["#", "STATE", "JOB", "NODES", "RESUMED AT", "EXIT", "REASON"],
        [
            (
                a["number"],
                a["state"],
                a["slurm_job_id"],
                a["node_list"],
                a["resume_step"],
                a["exit_code"],
                a["end_reason"],
            )
            for a in run["attempts"]
        ],
    )


@app.command()
def cancel(
    run_id: int,
    now: bool = typer.Option(
        False, "--now", help="Stop its Slurm jobs at once, without a last checkpoint."
    ),
    json: bool = JSON,
) -> None:
    """Cancel a run: its training ranks save a checkpoint and exit, then its jobs end."""
    run = call(lambda c: c.cancel_run(run_id, now=now))
    if json:
        return print_json(run)
    how = "its jobs are being stopped" if now else "saving a last checkpoint, then stopping"
    console.print(f"run {run_id}: {run['state']} ({how})")
    hint(f"runyard run show {run_id}")


@app.command()
def checkpoints(run_id: int, json: bool = JSON) -> None:
    """A run's checkpoints and their state."""
    rows = call(lambda c: c.run_checkpoints(run_id))
    if json:
        return print_json(rows)
    print_table(
        f"checkpoints of run {run_id}",
        ["STEP", "STATE", "SIZE MiB", "WRITE S", "PATH"],
        [
            (
                c["step"],
                c["state"],
                fmt_float((c["num_bytes"] or 0) / 2**20, 2),
                fmt_float(c["write_s"], 2),
                c["path"],
            )
            for c in rows
        ],
    )


@app.command()
def events(run_id: int, json: bool = JSON) -> None:
    """A run's timeline."""
    rows = call(lambda c: c.run_events(run_id))
    if json:
        return print_json(rows)
    print_table(
        f"timeline of run {run_id}",
        ["TIME", "KIND", "MESSAGE"],
        [(short_time(e["created_at"]), e["kind"], e["message"]) for e in rows],
    )


@app.command()
def watch(
    run_id: int,
    interval_s: float = typer.Option(2.0, help="Seconds between polls."),
    timeout_s: float = typer.Option(0, help="Give up after this long (0: never)."),
) -> None:
    """Follow a run live until it ends: progress with ETA, loss, tokens/s, MFU, goodput,
    the current attempt and its nodes, the last events.

    Exit code: 0 SUCCEEDED, 1 FAILED, 4 CANCELLED, 5 still running at --timeout-s,
    3 service unreachable.
    """
    code = call(lambda c: watch_run(c, run_id, console, interval_s, timeout_s))
    if code != Exit.OK:
        hint(f"runyard run show {run_id}; runyard run logs {run_id}")
    raise typer.Exit(code)


@app.command()
def logs(
    run_id: int,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing as ranks write."),
    rank: int = typer.Option(0, help="Which rank's output (0 prints the training steps)."),
    attempt: int | None = typer.Option(None, help="Only this attempt (default: all of them)."),
    interval_s: float = typer.Option(1.0, help="Seconds between polls with --follow."),
) -> None:
    """A rank's output across attempts; with -f, followed live into new attempts."""

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def header(text: str) -> None:
        console.print(f"[dim]{text}[/dim]", highlight=False)

    call(
        lambda c: show_logs(
            c,
            run_id,
            write,
            header,
            rank=rank,
            attempt=attempt,
            follow=follow,
            interval_s=interval_s,
        )
    )


@app.command()
def report(
    run_id: int,
    out: Path = typer.Option(..., "--out", help="Folder for report.html and the PNG plots."),
) -> None:
    """Write a self-contained HTML report with plots: loss, throughput and MFU, goodput,
    the recovery timeline, and the plan beside what was achieved."""
    from client.report import write_report  # matplotlib loads only for this command

    try:
        path = call(lambda c: write_report(c, run_id, out))
    except OSError as exc:
        fail(f"cannot write the report into {out}: {exc.strerror}", Exit.USAGE)
    console.print(f"report of run {run_id}: {path}")
    hint(f"open {path} in a browser")


class ExportFormat(StrEnum):
    HF = "hf"  # a Hugging Face Llama folder: config.json, safetensors shards, tokenizer


@app.command()
def export(
    run_id: int,
    out: Path = typer.Option(..., "--out", help="A new (or empty) folder to write."),
    step: int | None = typer.Option(None, "--step", help="Committed step (default: newest)."),
    format: ExportFormat = typer.Option(ExportFormat.HF, "--format", help="hf: Hugging Face."),
    tokenizer: Path | None = typer.Option(
        None, help="Tokenizer folder to include (default: the from_hf folder's, if the data's)."
    ),
    max_shard_mb: int = typer.Option(4096, help="Largest safetensors file written."),
    json: bool = JSON,
) -> None:
    """Write a committed checkpoint as a Hugging Face Llama folder, whatever layout trained
    it. Runs here: needs the shared filesystem and the worker's packages (torch)."""
    from client.hf_export import ExportChoiceError, export_source

    run = call(lambda c: c.get_run(run_id))
    rows = call(lambda c: c.run_checkpoints(run_id))
    try:
        source = export_source(run, rows, step, tokenizer)
    except ExportChoiceError as exc:
        fail(f"run {run_id}: {exc}", Exit.USAGE)
    try:
        from worker.hf.export import ExportError, export_hf
    except ImportError as exc:
        fail(f"export needs the worker's packages here ({exc.name}): pip install runyard[worker]")
    try:
        files = export_hf(
            source.path,
            source.shape,
            out,
            tokenizer=source.tokenizer,
            tokenizer_sha256=source.tokenizer_sha256,
            max_positions=source.max_positions,
            eos_id=source.eos_id,
            max_shard_bytes=max_shard_mb << 20,
        )
    except (ExportError, OSError) as exc:
        fail(f"run {run_id} step {source.step}: {exc}", Exit.ERROR)
    if json:
        return print_json({"run_id": run_id, "step": source.step, "out": str(out), "files": files})
    console.print(f"exported run {run_id} step {source.step} to {out}: {', '.join(files)}")
    if source.note:
        console.print(f"no tokenizer: {source.note}", highlight=False)
    hint(f"transformers.AutoModelForCausalLM.from_pretrained({str(out.resolve())!r})")
