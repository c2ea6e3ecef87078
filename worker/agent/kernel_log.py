"""Find NVIDIA Xid and NVSwitch SXid reports in kernel log lines, in their real formats.

NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
[ 5678.123456] NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, Contained ...
nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 46 LTSSM Fault Up
nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass

XID = re.compile(r"NVRM: Xid \((?P<pci>PCI:[0-9a-fA-F:.]+)\): (?P<code>\d+),\s*(?P<rest>.*)")
SXID = re.compile(
    r"nvidia-nvswitch(?P<switch>\d+): SXid \((?P<pci>PCI:[0-9a-fA-F:.]+)\): (?P<code>\d+),"
    r"\s*(?P<severity>Non-fatal|Fatal)\b,?\s*(?P<rest>.*)"
)


@dataclass(frozen=True)
class KernelSignal:
    kind: str  # "xid", "sxid:fatal" or "sxid:nonfatal"
    code: int
    pci: str
    message: str  # the whole line, as the kernel wrote it


def parse_line(line: str) -> KernelSignal | None:
    """The Xid or SXid a kernel log line reports, or None for any other line."""
    text = line.strip()
    if (m := XID.search(text)) is not None:
        return KernelSignal("xid", int(m["code"]), m["pci"], text)
    if (m := SXID.search(text)) is not None:
        kind = "sxid:fatal" if m["severity"] == "Fatal" else "sxid:nonfatal"
        return KernelSignal(kind, int(m["code"]), m["pci"], text)
    return None


NCCL_PATTERNS = (
    re.compile(r"NCCL WARN"),
    re.compile(r"\bnccl(Remote|System|Internal|InvalidUsage)Error\b"),
    re.compile(r"Watchdog caught collective operation timeout"),
    re.compile(r"NCCL error", re.IGNORECASE),
)


def is_nccl_error(line: str) -> bool:
    """A run log line that reports an NCCL failure (WARN lines, error codes, watchdog)."""
    return any(p.search(line) for p in NCCL_PATTERNS)
