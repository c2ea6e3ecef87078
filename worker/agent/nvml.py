"""GPU health through NVML (nvidia-ml-py), where a GPU exists.

Reports transitions only (a pending row remap is reported once, not every poll). Without a
GPU or a driver, `NvmlWatcher.available` is False and the agent says so once.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("runyard.agent")


class NvmlWatcher:
    def __init__(self) -> None:
        self.available = False
        self._seen: set[str] = set()
        self._last_dbe: dict[int, int] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml: Any = pynvml
            self.count = pynvml.nvmlDeviceGetCount()
            self.available = self.count > 0
        except Exception as exc:  # no driver, no library, or no GPU
            log.info("NVML unavailable (%s): GPU health checks are off on this node", exc)
            self.count = 0

    def poll(self) -> list[tuple[str, int, str]]:
        """New problems as (kind, gpu index, message)."""
        if not self.available:
            return []
        nv, found = self._nvml, []
        for i in range(self.count):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            try:
                dbe = nv.nvmlDeviceGetTotalEccErrors(
                    handle, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                )
                if dbe > self._last_dbe.get(i, 0):
                    found.append(
                        (
                            "nvml:double_bit_ecc",
                            i,
                            f"GPU {i}: {dbe} uncorrected ECC errors since the last reset",
                        )
                    )
                self._last_dbe[i] = dbe
            except nv.NVMLError:
                pass  # ECC off or not supported on this GPU
            try:
                remap = nv.nvmlDeviceGetRemappedRows(handle)  # (corr, unc, pending, failed)
                if remap[2]:
                    found.append(
                        ("nvml:pending_row_remap", i, f"GPU {i}: row remap pending (needs a reset)")
                    )
            except nv.NVMLError:
                pass
            try:
                if nv.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    found.append(
                        ("nvml:retired_pages_pending", i, f"GPU {i}: retired pages pending a reset")
                    )
            except nv.NVMLError:
                pass
            try:
                reasons = nv.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
                hot = (
                    nv.nvmlClocksThrottleReasonHwThermalSlowdown
                    | nv.nvmlClocksThrottleReasonSwThermalSlowdown
                    | nv.nvmlClocksThrottleReasonHwPowerBrakeSlowdown
                )
                if reasons & hot:
                    found.append(
                        (
                            "nvml:thermal_throttle",
                            i,
                            f"GPU {i}: clocks throttled (reasons 0x{reasons:x})",
                        )
                    )
            except nv.NVMLError:
                pass
        fresh = [f for f in found if f"{f[0]}:{f[1]}" not in self._seen]
        self._seen = {f"{k}:{i}" for k, i, _ in found}
        return fresh
