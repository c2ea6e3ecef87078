"""Record what every Slurm command runyard runs prints, on a real cluster, as parser fixtures.

    SLURM_CONF=<cluster>/slurm.conf PATH=<prefix>/bin:$PATH \
        .venv/bin/python scripts/record_slurm_outputs.py tests/fixtures/slurm_outputs/24.11

The cluster is put in each state the adapters read (jobs completed, failed, cancelled,
running, pending, an array with tasks held back by its limit, a reservation, a drained
node), then every query is run in its text form and, where the version has one, its JSON
form. Each output goes to a file of its own; `manifest.json` says which command made it and
which job ids are in which state, so the parser tests can check real output against what
really happened. On a shared cluster run it under the exclusive integration lock: it
drains a node for a moment and fills nodes with jobs. Everything it made is cancelled,
deleted or resumed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PARTITION = "train"
PREFIX = "runyard-record"


def slurm(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
    return out


def wait_until(what: str, probe: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.5)


def sbatch(*args: str) -> str:
    argv = ["sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null", *args]
    return slurm(*argv).stdout.strip().split(";")[0]


def state_of(job_id: str) -> str:
    out = slurm("squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T", check=False).stdout
    return out.strip().splitlines()[0] if out.strip() else ""


def in_accounting(job_ids: list[str]) -> bool:
    out = slurm("sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", "JobID,State").stdout
    ended = ("COMPLETED", "FAILED", "CANCELLED")
    return sum(1 for line in out.splitlines() if line.split("|")[-1].startswith(ended)) >= len(
        job_ids
    )


def reserved_nodes() -> set[str]:
    """Nodes in some reservation (a dev service's spare pool): jobs of ours cannot use them."""
    found: set[str] = set()
    for line in slurm("scontrol", "show", "reservation", "-o", check=False).stdout.splitlines():
        for token in line.split():
            if token.startswith("Nodes=") and token != "Nodes=(null)":
                names = slurm("scontrol", "show", "hostnames", token.removeprefix("Nodes="))
                found.update(names.stdout.split())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the outputs (one per version)")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    version = slurm("scontrol", "--version").stdout.strip()
    idle = slurm("sinfo", "-h", "-N", "-p", PARTITION, "-t", "idle", "-o", "%N").stdout.split()
    nodes = [n for n in idle if n not in reserved_nodes()]
    if len(nodes) < 6:
        sys.exit(f"needs 6 idle nodes in '{PARTITION}', found {len(nodes)}: is a test running?")
    drained, reserved = nodes[-1], nodes[-2]
    made: dict[str, object] = {"version": version, "partition": PARTITION}
    jobs: dict[str, str] = {}
    reservation = f"{PREFIX}-res"
    try:
        jobs["completed"] = sbatch("-J", f"{PREFIX}-ok", "-N1", "--wrap", "true")
        jobs["failed"] = sbatch("-J", f"{PREFIX}-fail", "-N1", "--wrap", "exit 3")
        jobs["cancelled"] = sbatch("-J", f"{PREFIX}-cancel", "-N1", "--wrap", "sleep 600")
        wait_until("the jobs to end or run", lambda: state_of(jobs["cancelled"]) == "RUNNING")
        slurm("scancel", jobs["cancelled"])
        wait_until(
            "the first jobs to end",
            lambda: all(
                state_of(jobs[k]) in ("COMPLETED", "FAILED", "CANCELLED")
                for k in ("completed", "failed", "cancelled")
            ),
        )
        jobs["running"] = sbatch(
            "-J",
            f"{PREFIX}-run",
            "-N2",
            "--exclusive",
            "-w",
            ",".join(nodes[:2]),
            "--wrap",
            "sleep 600",
        )
        jobs["array"] = sbatch(
            "-J", f"{PREFIX}-array", "-N1", "--exclusive", "--array=0-2%1", "--wrap", "sleep 600"
        )
        # Asks for every node of the partition: it waits for resources.
        jobs["pending"] = sbatch("-J", f"{PREFIX}-wait", f"-N{len(nodes)}", "--wrap", "true")
        wait_until("the running job", lambda: state_of(jobs["running"]) == "RUNNING")
        wait_until("the array's first task", lambda: state_of(f"{jobs['array']}_0") == "RUNNING")
        slurm(
            "scontrol",
            "create",
            f"reservation={reservation}",
            f"nodes={reserved}",
            "starttime=now",
            "duration=infinite",
            "users=root",
            "flags=ignore_jobs,maint",
        )
        slurm(
            "scontrol",
            "update",
            f"nodename={drained}",
            "state=drain",
            "reason=runyard: Xid 79 on GPU 3 (recording fixtures)",
        )
        wait_until(
            "accounting to list the ended jobs",
            lambda: in_accounting([jobs["completed"], jobs["failed"], jobs["cancelled"]]),
            timeout_s=60,
        )
        made |= {"jobs": jobs, "reservation": reservation, "drained": drained, "nodes": nodes}
        made["outputs"] = record_all(out, jobs, reservation, drained)
    finally:
        for job_id in jobs.values():
            slurm("scancel", job_id, check=False)
        slurm("scontrol", "delete", f"reservation={reservation}", check=False)
        slurm("scontrol", "update", f"nodename={drained}", "state=resume", check=False)
    (out / "manifest.json").write_text(json.dumps(made, indent=2) + "\n")
    print(f"recorded {len(made.get('outputs', {}))} outputs of {version} into {out}")  # type: ignore[arg-type]


def record_all(
    out: Path, jobs: dict[str, str], reservation: str, drained: str
) -> dict[str, list[str]]:
    """Every query runyard runs (service/slurm, client/doctor, client/devcluster, worker),
    text and JSON, each into its own file; the file name -> the command."""
    all_ids = ",".join(
        [jobs[k] for k in ("completed", "failed", "cancelled", "running", "pending")]
        + [f"{jobs['array']}_{t}" for t in range(3)]
    )
    ended_ids = ",".join(jobs[k] for k in ("completed", "failed", "cancelled"))
    sacct_fields = "JobID,State,NodeList,ExitCode,Reason"
    queries: dict[str, list[str]] = {
        "scontrol_version.txt": ["scontrol", "--version"],
        "scontrol_ping.txt": ["scontrol", "ping"],
        "scontrol_show_config.txt": ["scontrol", "show", "config"],
        "squeue_jobs.txt": ["squeue", "-h", "-r", "-j", all_ids, "-o", "%i|%T|%N|%r"],
        "squeue_jobs.json": ["squeue", "--json", "-r", "-j", all_ids],
        "squeue_names.txt": ["squeue", "-h", "-t", "all", "-o", "%j|%i"],
        "squeue_names.json": ["squeue", "--json", "-t", "all"],
        "squeue_array.txt": [
            "squeue",
            "-h",
            "-r",
            "-t",
            "all",
            "-n",
            f"{PREFIX}-array",
            "-o",
            "%F",
        ],
        "squeue_unknown_job.txt": ["squeue", "-h", "-r", "-j", "999999", "-o", "%i|%T|%N|%r"],
        "squeue_unknown_job.json": ["squeue", "--json", "-r", "-j", "999999"],
        "squeue_array.json": ["squeue", "--json", "-r", "-t", "all", "-n", f"{PREFIX}-array"],
        "scontrol_show_job.txt": ["scontrol", "show", "job", "-o"],
        "scontrol_show_job.json": ["scontrol", "--json", "show", "job"],
        "scontrol_show_one_job.txt": ["scontrol", "show", "job", "-o", jobs["failed"]],
        "scontrol_show_one_job.json": ["scontrol", "--json", "show", "job", jobs["failed"]],
        "scontrol_show_unknown_job.txt": ["scontrol", "show", "job", "-o", "999999"],
        "scontrol_show_unknown_job.json": ["scontrol", "--json", "show", "job", "999999"],
        "scontrol_show_node.txt": ["scontrol", "show", "node", "-o"],
        "scontrol_show_node.json": ["scontrol", "--json", "show", "node"],
        "scontrol_show_one_node.txt": ["scontrol", "show", "node", drained, "-o"],
        "scontrol_show_topology.txt": ["scontrol", "show", "topology"],
        "scontrol_show_reservation.txt": ["scontrol", "show", "reservation", "-o"],
        "scontrol_show_reservation.json": ["scontrol", "--json", "show", "reservation"],
        "scontrol_create_duplicate_reservation.txt": [
            "scontrol",
            "create",
            f"reservation={reservation}",
            f"nodes={drained}",
            "starttime=now",
            "duration=infinite",
            "users=root",
            "flags=ignore_jobs,maint",
        ],
        "sacct.txt": ["sacct", "-n", "-X", "-P", "-j", ended_ids, "-o", sacct_fields],
        "sacct.json": ["sacct", "--json", "-X", "-j", ended_ids],
        "sinfo_gres.txt": ["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N|%G"],
        "sinfo_states.txt": ["sinfo", "-h", "-N", "-o", "%N %T"],
        "sbatch_submitted.txt": [
            "sbatch",
            "-p",
            PARTITION,
            "-o",
            "/dev/null",
            "-H",
            "--wrap",
            "true",
        ],
    }
    for name, argv in queries.items():
        done = slurm(*argv, check=False)
        (out / name).write_text(done.stdout)
        if done.stderr.strip() or done.returncode:
            (out / f"{name}.stderr").write_text(f"exit {done.returncode}\n{done.stderr}")
        if name == "sbatch_submitted.txt":
            held = done.stdout.split()[-1]
            slurm("scancel", held, check=False)
    return queries


if __name__ == "__main__":
    main()
