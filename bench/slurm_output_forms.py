"""Text or JSON: how long each of runyard's read queries takes in each form, on a real Slurm,
with a queue of held jobs of the size a busy tick sees; and whether the form runyard uses on
this release (contract/slurm_features.py) is the faster one.

    SLURM_CONF=... PATH=<prefix>/bin:$PATH .venv/bin/python bench/slurm_output_forms.py

Each query is the command plus its parse (service/slurm: commands.py and accounting.py for
text, queries.py's *_json for JSON), timed end to end as the reconciler pays it. The held
jobs are cancelled at the end. Target: the form used is the faster, or within 10% of it (a
JSON form that close would be worth its structure: flag lists, no parsing of key=value).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable

from contract.slurm_features import SlurmFeature
from service.slurm import accounting, commands, queries, version
from service.slurm.commands import run_slurm, slurm_env

TOLERANCE = 0.10


def timed(call: Callable[[], object], repeats: int) -> float:
    took = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="held jobs in the queue")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    release = version.current(slurm_env())
    held = []
    for _ in range(args.jobs):
        out = run_slurm(["sbatch", "--parsable", "-H", "-o", "/dev/null", "--wrap", "true"])
        held.append(out.strip().split(";")[0])
    try:
        ids = held[:50]
        forms: dict[str, tuple[Callable[[], object], Callable[[], object], SlurmFeature]] = {
            "squeue -j (50 ids)": (
                lambda: commands.squeue(ids),
                lambda: queries.squeue_json(ids),
                SlurmFeature.SQUEUE_JSON,
            ),
            "scontrol show job (all)": (
                lambda: commands.show_jobs(ids),
                lambda: queries.show_jobs_json(ids),
                SlurmFeature.SCONTROL_JSON,
            ),
            "scontrol show node": (
                commands.show_nodes,
                queries.show_nodes_json,
                SlurmFeature.SCONTROL_JSON,
            ),
            "scontrol show reservation": (
                commands.show_reservations,
                queries.show_reservations_json,
                SlurmFeature.SCONTROL_JSON,
            ),
            "sacct -j (50 ids)": (
                lambda: accounting.ended_jobs(ids),
                lambda: queries.ended_jobs_json(ids),
                SlurmFeature.SACCT_JSON,
            ),
        }
        figures: dict[str, dict[str, object]] = {}
        met = True
        print(f"Slurm {release.version}, {args.jobs} held jobs, median of {args.repeats}")
        for name, (text_form, json_form, feature) in forms.items():
            text_ms = timed(text_form, args.repeats)
            has_json = feature in release.available
            json_ms = timed(json_form, args.repeats) if has_json else None
            used = "json" if release.has(feature) else "text"
            used_ms = json_ms if used == "json" and json_ms is not None else text_ms
            best = min(t for t in (text_ms, json_ms) if t is not None)
            ok = used_ms <= best * (1 + TOLERANCE)
            met &= ok
            shown = f"{json_ms:7.1f} ms" if json_ms is not None else "    n/a  "
            verdict = "ok" if ok else "SLOWER"
            print(f"{name:28s} text {text_ms:7.1f} ms  json {shown}  uses {used}  {verdict}")
            figures[name] = {"text_ms": text_ms, "json_ms": json_ms, "uses": used, "ok": ok}
    finally:
        subprocess.run(["scancel", *held], env=slurm_env(), capture_output=True)
    print(
        json.dumps(
            {
                "bench": "slurm_output_forms",
                "slurm": str(release.version),
                "held_jobs": args.jobs,
                "figures": figures,
                "target": f"the form used is the faster or within {TOLERANCE:.0%} of it",
                "target_met": met,
            }
        )
    )


if __name__ == "__main__":
    main()
