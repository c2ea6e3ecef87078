"""Where the agent reads from: a kernel log file (dev cluster, or a syslog file), /dev/kmsg,
run log files (NCCL lines), and NVML. Each returns events ready for the outbox."""

from __future__ import annotations

import glob
import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from worker.agent.kernel_log import is_nccl_error, parse_line
from worker.agent.outbox import Outbox

MAX_READ_BYTES = 1 << 20


def _now() -> str:
    return datetime.now(UTC).isoformat()


def signal_event(
    node: str,
    key: str,
    kind: str,
    code: int | None,
    message: str,
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "idempotency_key": key,
        "kind": kind,
        "code": code,
        "message": message[:4000],
        "observed_at": _now(),
        "data": data or {},
    }


class FileFollower:
    """Reads whole new lines of a growing file; survives rotation and agent restarts."""

    def __init__(self, path: Path, source: str, outbox: Outbox) -> None:
        self.path, self.source, self.outbox = path, source, outbox

    def read_new_lines(self) -> tuple[list[tuple[int, str]], dict[str, Any]] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        pos = self.outbox.position(self.source) or {"inode": st.st_ino, "offset": 0}
        if pos["inode"] != st.st_ino or st.st_size < pos["offset"]:
            pos = {"inode": st.st_ino, "offset": 0}  # rotated or truncated: start over
        if st.st_size == pos["offset"]:
            return [], pos
        with open(self.path, "rb") as f:
            f.seek(pos["offset"])
            chunk = f.read(MAX_READ_BYTES)
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written line waits for its end
        lines, offset = [], pos["offset"]
        for raw in complete.splitlines(keepends=True):
            lines.append((offset, raw.decode("utf-8", "replace")))
            offset += len(raw)
        return lines, {"inode": st.st_ino, "offset": offset}


def poll_kernel_file(node: str, follower: FileFollower) -> int:
    got = follower.read_new_lines()
    if got is None:
        return 0
    lines, position = got
    events = []
    for offset, line in lines:
        sig = parse_line(line)
        if sig is not None:
            key = f"{node}:kern:{position['inode']}:{offset}"
            events.append(
                signal_event(node, key, sig.kind, sig.code, sig.message, {"pci": sig.pci})
            )
    follower.outbox.put(events, follower.source, position)
    return len(events)


def poll_kmsg(node: str, outbox: Outbox, fd: int) -> int:
    """/dev/kmsg: one record per read, 'prio,seq,usec,flags;message'. Keeps the last seq."""
    last = (outbox.position("kmsg") or {}).get("seq", -1)
    events, seq = [], last
    while True:
        try:
            record = os.read(fd, 8192).decode("utf-8", "replace")
        except BlockingIOError:
            break
        except BrokenPipeError:  # overwritten records: continue with what follows
            continue
        header, _, message = record.partition(";")
        fields = header.split(",")
        seq = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else seq
        if seq <= last:
            continue
        sig = parse_line(message)
        if sig is not None:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
            events.append(
                signal_event(
                    node,
                    f"{node}:kmsg:{boot}:{seq}",
                    sig.kind,
                    sig.code,
                    sig.message,
                    {"pci": sig.pci},
                )
            )
    if seq != last:
        outbox.put(events, "kmsg", {"seq": seq})
    return len(events)


def scan_run_logs(node: str, pattern: str, outbox: Outbox) -> int:
    """NCCL WARN / error lines in the runs' log files (keys shared by all agents: the
    service stores each line once however many agents see the shared file)."""
    found = 0
    for name in sorted(glob.glob(pattern, recursive=True)):
        path = Path(name)
        follower = FileFollower(path, f"log:{path}", outbox)
        got = follower.read_new_lines()
        if got is None:
            continue
        lines, position = got
        events = []
        for offset, line in lines:
            if is_nccl_error(line):
                digest = hashlib.sha1(f"{path}:{position['inode']}:{offset}".encode()).hexdigest()
                events.append(
                    signal_event(
                        node,
                        f"nccl:{digest}",
                        "nccl:log_error",
                        None,
                        line.strip(),
                        {"file": str(path)},
                    )
                )
        outbox.put(events, follower.source, position)
        found += len(events)
    return found
