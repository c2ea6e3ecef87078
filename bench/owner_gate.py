"""What acting as a run's owner costs: the service's gate (service/identity/gate.py) run as
the service's own user, through the real sudoers rule, as a dev user.

Each operation starts one interpreter under sudo. A `runyard run logs -f` follower costs one
log chunk per poll (every 0.5-1 s), so a chunk must come back well inside that.

    sudo -u runyard .venv/bin/python3 bench/owner_gate.py   # (as root: it re-runs itself so)

Needs `runyard dev up` (the users and the rule). Last line: JSON with the figures.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SERVICE_USER, OWNER = "runyard", "alice"
REPEATS = 7
CHUNK_TARGET_S = 0.5  # a follower polls every 0.5-1 s


def timed(call: Callable[[], object]) -> list[float]:
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    if os.geteuid() == 0:  # the gate is the service's: run as its user
        return subprocess.run(
            [sys.executable, __file__], user=SERVICE_USER, group=SERVICE_USER, extra_groups=[]
        ).returncode
    from service.config import Settings
    from service.identity.gate import OwnerGate
    from service.identity.owner import RunOwner

    gate = OwnerGate(Settings(accelerator="cpu", run_reconciler=False))
    owner = RunOwner(OWNER, "vision")
    with tempfile.NamedTemporaryFile("w", suffix=".out", delete=False) as log:
        log.write("step 1 loss 5.5\n" * 100)
    os.chmod(log.name, 0o644)
    shape = {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 128, "vocab": 256}
    figures = {
        "log_chunk_s": timed(lambda: gate.read_log(owner, Path(log.name), 0, 4096, complete=True)),
        "input_check_s": timed(
            lambda: gate.inspect(
                owner, from_hf=None, model=shape, data="builtin", seq_len=64, eval_every=None
            )
        ),
    }
    os.unlink(log.name)
    medians = {name: statistics.median(times) for name, times in figures.items()}
    for name, times in figures.items():
        print(f"{name:15s} median {medians[name]:.3f} s  (min {min(times):.3f}, "
              f"max {max(times):.3f}, {REPEATS} calls as {OWNER} via sudo)")  # fmt: skip
    met = medians["log_chunk_s"] <= CHUNK_TARGET_S
    print(json.dumps({**medians, "targets": {"log_chunk_s": CHUNK_TARGET_S}, "target_met": met}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
