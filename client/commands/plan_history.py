"""What `runyard plan` asks the service for: the cluster's calibration, and its accuracy.

The planner runs locally; the history it is calibrated from lives in the service's
database (service/plans/). `runyard plan` fetches the calibration (a handful of numbers)
and applies it to its local search, so it answers as a submitted run would be planned;
`runyard plan accuracy` prints the service's comparison of predicted against measured.
"""

from __future__ import annotations

from typing import Any

from client.api import ApiError, RunyardClient
from client.commands.common import call
from client.output import console, print_json, print_table
from planner.calibration import Calibration
from planner.schemas import CalibrationApplied

CALIBRATION_TIMEOUT_S = 3.0  # `runyard plan` stays quick when no service answers


def cluster_calibration(hardware: str, uncalibrated: bool) -> tuple[Calibration | None, str]:
    """(the service's calibration for a plan on `hardware`, or None; why, for people)."""
    if uncalibrated:
        return None, "uncalibrated: --uncalibrated (the published figures alone)"
    client = RunyardClient(timeout_s=CALIBRATION_TIMEOUT_S)
    try:
        shown = CalibrationApplied.model_validate(client.plan_calibration())
    except ApiError as exc:
        return None, f"uncalibrated: no calibration from the service ({exc.message})"
    if shown.hardware is not None and shown.hardware != hardware:
        return None, f"uncalibrated: the service's history is of {shown.hardware}, not {hardware}"
    return Calibration.from_schema(shown), shown.summary


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def accuracy(limit: int, as_json: bool) -> None:
    """Print predicted against measured, per run and per model size and layout family."""
    report: dict[str, Any] = call(lambda c: c.plan_accuracy(limit))
    if as_json:
        return print_json(report)
    console.print(report["calibration"]["summary"], highlight=False)
    print_table(
        "step time error by model size and layout family (predicted / measured - 1)",
        ["MODEL", "LAYOUT", "RUNS", "MEDIAN |ERR|", "WORST"],
        [
            (
                g["model_size"],
                g["layout_family"],
                str(g["num_runs"]),
                "-" if g["median_abs_step_error"] is None else f"{g['median_abs_step_error']:.1%}",
                _pct(g["worst_step_error"]),
            )
            for g in report["groups"]
        ],
    )
    runs = report["runs"]
    print_table(
        "runs: step time, predicted and measured",
        ["RUN", "MODEL", "LAYOUT", "GPUS", "PREDICTED S", "MEASURED S", "ERR"],
        [
            (
                str(r["run_id"]) + ("" if r["comparable"] else f" ({r['accelerator']})"),
                r["model_size"],
                r["layout_family"],
                str(r["num_gpus"]),
                _num(r["predicted_step_s"]),
                _num(r["measured_step_s"]),
                _pct(r["step_error"]),
            )
            for r in runs
        ],
    )
    print_table(
        "runs: predicted / measured",
        ["RUN", "TOK/S/GPU", "MFU", "CKPT STALL S", "RESTART S", "RECOVERIES"],
        [
            (
                str(r["run_id"]),
                f"{_num(r['predicted_tokens_per_s_per_gpu'])} / "
                f"{_num(r['measured_tokens_per_s_per_gpu'])}",
                f"{_num(r['predicted_mfu'], 2)} / {_num(r['measured_mfu'], 2)}",
                f"{_num(r['predicted_checkpoint_s'])} / {_num(r['measured_checkpoint_s'])}",
                f"{_num(r['predicted_restart_s'])} / {_num(r['measured_restart_s'])}",
                str(len(r["recoveries"])),
            )
            for r in runs
        ],
    )
