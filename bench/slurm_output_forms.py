"""Text or JSON: how long each of runyard's read queries takes in each form, on a real Slurm,
with a queue of held jobs of the size a busy tick sees; and whether the form runyard uses on
this release (contract/slurm_features.py) is the faster one.

    SLURM_CONF=... PATH=<prefix>/bin:$PATH .venv/bin/python bench/slurm_output_forms.py
    .venv/bin/python bench/slurm_output_forms.py --smoke   # no Slurm: made-up times

Each query is the command plus its parse (service/slurm: commands.py and accounting.py for
text, queries.py's *_json for JSON), timed end to end as the reconciler pays it. The held
jobs are cancelled at the end. Target: the form used is the faster, or within 10% of it (a
JSON form that close would be worth its structure: flag lists, no parsing of key=value).
--smoke submits and runs nothing: it judges made-up times (SMOKE_MS) on 22.05 and 24.11,
the releases runyard is tested on, with the same verdict and JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract.slurm_features import SlurmFeature, SlurmVersion
from service.slurm import accounting, commands, queries, version
from service.slurm.commands import run_slurm, slurm_env
from service.slurm.target import SlurmTarget

HERE = SlurmTarget("")  # the Slurm of this environment's SLURM_CONF, as the reconciler's own
TOLERANCE = 0.10
Forms = dict[str, tuple[Callable[[], object], Callable[[], object], SlurmFeature]]
# --smoke's (text ms, JSON ms) for each query, made up.
SMOKE_MS = {
    "squeue -j (50 ids)": (14.0, 19.0),
    "scontrol show job (all)": (16.0, 22.0),
    "scontrol show node": (11.0, 15.0),
    "scontrol show reservation": (9.0, 12.0),
    "sacct -j (50 ids)": (25.0, 31.0),
}
SMOKE_RELEASES = (SlurmVersion(22, 5, 8), SlurmVersion(24, 11, 5))


def timed(call: Callable[[], object], repeats: int) -> float:
    took = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def forms_of(ids: list[str]) -> Forms:
    """Each query: its text form, its JSON form, and the feature that picks JSON."""
    return {
        "squeue -j (50 ids)": (
            lambda: commands.squeue(HERE, ids),
            lambda: queries.squeue_json(HERE, ids),
            SlurmFeature.SQUEUE_JSON,
        ),
        "scontrol show job (all)": (
            lambda: commands.show_jobs(HERE, ids),
            lambda: queries.show_jobs_json(HERE, ids),
            SlurmFeature.SCONTROL_JSON,
        ),
        "scontrol show node": (
            lambda: commands.show_nodes(HERE),
            lambda: queries.show_nodes_json(HERE),
            SlurmFeature.SCONTROL_JSON,
        ),
        "scontrol show reservation": (
            lambda: commands.show_reservations(HERE),
            lambda: queries.show_reservations_json(HERE),
            SlurmFeature.SCONTROL_JSON,
        ),
        "sacct -j (50 ids)": (
            lambda: accounting.ended_jobs(HERE, ids),
            lambda: queries.ended_jobs_json(HERE, ids),
            SlurmFeature.SACCT_JSON,
        ),
    }


def judge(
    name: str,
    text_ms: float,
    json_ms: float | None,
    feature: SlurmFeature,
    release: version.SlurmRelease,
) -> dict[str, Any]:
    """Which form `release` uses for one query, and whether it is the faster (or within
    TOLERANCE of it); printed."""
    used = "json" if release.has(feature) else "text"
    used_ms = json_ms if used == "json" and json_ms is not None else text_ms
    best = min(t for t in (text_ms, json_ms) if t is not None)
    ok = used_ms <= best * (1 + TOLERANCE)
    shown = f"{json_ms:7.1f} ms" if json_ms is not None else "    n/a  "
    verdict = "ok" if ok else "SLOWER"
    print(f"{name:28s} text {text_ms:7.1f} ms  json {shown}  uses {used}  {verdict}")
    return {"text_ms": text_ms, "json_ms": json_ms, "uses": used, "ok": ok}


def smoke() -> None:
    met, by_release = True, {}
    for release in map(version.SlurmRelease.of, SMOKE_RELEASES):
        print(f"Slurm {release.version}, made-up times")
        figures = {}
        for name, (_, _, feature) in forms_of([]).items():
            text_ms, json_ms = SMOKE_MS[name]
            has_json = feature in release.available
            figures[name] = judge(name, text_ms, json_ms if has_json else None, feature, release)
            met &= figures[name]["ok"]
        by_release[str(release.version)] = figures
    out = {"bench": "slurm_output_forms", "smoke": True, "inputs": "made-up times; no Slurm"}
    target = f"the form used is the faster or within {TOLERANCE:.0%} of it"
    print(json.dumps(out | {"figures": by_release, "target": target, "target_met": met}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="held jobs in the queue")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--smoke", action="store_true", help="no Slurm: made-up times")
    args = parser.parse_args()
    if args.smoke:
        smoke()
        return
    release = version.current(slurm_env())
    held = []
    for _ in range(args.jobs):
        out = run_slurm(HERE, ["sbatch", "--parsable", "-H", "-o", "/dev/null", "--wrap", "true"])
        held.append(out.strip().split(";")[0])
    try:
        figures: dict[str, dict[str, Any]] = {}
        met = True
        print(f"Slurm {release.version}, {args.jobs} held jobs, median of {args.repeats}")
        for name, (text_form, json_form, feature) in forms_of(held[:50]).items():
            text_ms = timed(text_form, args.repeats)
            has_json = feature in release.available
            json_ms = timed(json_form, args.repeats) if has_json else None
            figures[name] = judge(name, text_ms, json_ms, feature, release)
            met &= figures[name]["ok"]
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
