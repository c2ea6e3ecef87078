"""What acting as a run's owner costs: the service's gate (service/identity/gate.py) run as
the service's own user, through the real sudoers rule, as a dev user.

Each operation starts one interpreter under sudo. A `runyard run logs -f` follower costs one
log chunk per poll (every 0.5-1 s), so a chunk must come back well inside that.

    sudo -u runyard .venv/bin/python3 bench/owner_gate.py   # (as root: it re-runs itself so)
    .venv/bin/python bench/owner_gate.py --smoke   # acts as nobody: no sudo, no dev cluster

Needs `runyard dev up` (the users and the rule). Last line: JSON with the figures.
--smoke makes the same gate calls on a gate whose every answer is recorded (RecordedGate:
nothing runs under sudo), so its times are the bench's own and say nothing of sudo's.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import Settings
from service.identity.gate import OwnerGate
from service.slurm.owner import RunOwner

SERVICE_USER, OWNER = "runyard", "alice"
REPEATS = 7
CHUNK_TARGET_S = 0.5  # a follower polls every 0.5-1 s
LOG_TEXT = "step 1 loss 5.5\n" * 100
SHAPE = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 128, "vocab": 256}


class RecordedGate(OwnerGate):
    """--smoke's gate: each operation gets the answer the owner's side gives it (as_owner),
    made here instead of under sudo."""

    def _call(
        self, owner: RunOwner, op: str, payload: Mapping[str, Any], timeout_s: float = 0.0
    ) -> Any:
        if op == "read_log":
            chunk = LOG_TEXT.encode()[payload["offset"] : payload["offset"] + payload["limit"]]
            data = base64.b64encode(chunk).decode()
            return {"exists": True, "data": data, "size": len(LOG_TEXT)}
        if op == "inspect":
            return {"shape": payload["model"], "problems": []}
        raise AssertionError(f"the bench makes no {op} call")


def timed(call: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def measure(gate: OwnerGate) -> dict[str, list[float]]:
    """Each operation's times, REPEATS calls as OWNER."""
    owner = RunOwner(OWNER, "vision")
    with tempfile.NamedTemporaryFile("w", suffix=".out", delete=False) as log:
        log.write(LOG_TEXT)
    os.chmod(log.name, 0o644)
    try:
        return {
            "log_chunk_s": timed(
                lambda: gate.read_log(owner, Path(log.name), 0, 4096, complete=True)
            ),
            "input_check_s": timed(
                lambda: gate.inspect(
                    owner, from_hf=None, model=SHAPE, data="builtin", seq_len=64, eval_every=None
                )
            ),
        }
    finally:
        os.unlink(log.name)


def summary(figures: dict[str, list[float]], how: str = "via sudo") -> dict[str, Any]:
    """Each operation's median (its times printed), the target and "target_met"."""
    medians = {name: statistics.median(times) for name, times in figures.items()}
    for name, times in figures.items():
        print(f"{name:15s} median {medians[name]:.6f} s  (min {min(times):.6f}, "
              f"max {max(times):.6f}, {len(times)} calls as {OWNER} {how})")  # fmt: skip
    met = medians["log_chunk_s"] <= CHUNK_TARGET_S
    targets = {"log_chunk_s": CHUNK_TARGET_S}
    return {"bench": "owner_gate", **medians, "targets": targets, "target_met": met}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="recorded answers: no sudo")
    args = parser.parse_args()
    settings = Settings(accelerator="cpu", run_reconciler=False)
    if args.smoke:
        out = summary(measure(RecordedGate(settings)), how="with recorded answers, no sudo")
        print(json.dumps(out | {"smoke": True, "inputs": "recorded answers; nothing under sudo"}))
        return 0
    if os.geteuid() == 0:  # the gate is the service's: run as its user
        return subprocess.run(
            [sys.executable, __file__], user=SERVICE_USER, group=SERVICE_USER, extra_groups=[]
        ).returncode
    print(json.dumps(summary(measure(OwnerGate(settings)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
