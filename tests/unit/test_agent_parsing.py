"""The agent's kernel-log parsing, read positions and outbox (real files, real SQLite)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.agent.kernel_log import is_nccl_error, parse_line
from worker.agent.outbox import Outbox
from worker.agent.sources import FileFollower, poll_kernel_file, scan_run_logs

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "kind", "code"),
    [
        (XID_79, "xid", 79),
        (
            "[ 5678.123456] NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, "
            "Contained: CE User Channel (0x9). RST: No, D-RST: No",
            "xid",
            94,
        ),
        (
            "Dec 02 14:00:01 gpu017 kernel: NVRM: Xid (PCI:0000:b5:00): 48, pid=77, name=python3, "
            "An uncorrectable double bit error",
            "xid",
            48,
        ),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 46 LTSSM Fault Up",
            "sxid:fatal",
            20034,
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            "sxid:nonfatal",
            12028,
        ),
    ],
)
def test_real_format_lines(line: str, kind: str, code: int) -> None:
    sig = parse_line(line)
    assert sig is not None and (sig.kind, sig.code) == (kind, code)
    assert sig.message == line.strip()


@pytest.mark.parametrize(
    "line",
    [
        "usb 1-1: new high-speed USB device",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
        "NVRM: Xid is a word in this sentence",
        "",
    ],
)
def test_other_lines_are_ignored(line: str) -> None:
    assert parse_line(line) is None


def test_nccl_lines() -> None:
    assert is_nccl_error("gpu001:1234:99 [0] NCCL WARN NET/IB : Got completion with error 12")
    assert is_nccl_error("RuntimeError: NCCL error in: ... ncclRemoteError: A call failed")
    assert is_nccl_error("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(...)")
    assert not is_nccl_error("NCCL INFO Channel 00/32 : 0 1 2 3")


def test_follower_reports_each_line_once_across_restarts(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("boot\n" + XID_79 + "\n")
    outbox = Outbox(tmp_path / "state" / "outbox.sqlite")
    assert poll_kernel_file("gpu001", FileFollower(log, "kernel", outbox)) == 1
    assert poll_kernel_file("gpu001", FileFollower(log, "kernel", outbox)) == 0
    # A half-written line waits until its newline arrives.
    with log.open("a") as f:
        f.write(XID_79.replace("79", "48"))
    again = Outbox(tmp_path / "state" / "outbox.sqlite")  # the agent restarted
    assert poll_kernel_file("gpu001", FileFollower(log, "kernel", again)) == 0
    with log.open("a") as f:
        f.write("\n")
    assert poll_kernel_file("gpu001", FileFollower(log, "kernel", again)) == 1
    queued = [e for _, e in again.peek(10)]
    assert [e["code"] for e in queued] == [79, 48]
    assert len({e["idempotency_key"] for e in queued}) == 2


def test_rotation_starts_over(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID_79 + "\n" + XID_79 + "\n")
    outbox = Outbox(tmp_path / "o.sqlite")
    assert poll_kernel_file("n", FileFollower(log, "kernel", outbox)) == 2
    log.unlink()
    log.write_text(XID_79 + "\n")  # a new file (new inode), shorter than the old offset
    assert poll_kernel_file("n", FileFollower(log, "kernel", outbox)) == 1


def test_outbox_keeps_order_and_acks(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.sqlite")
    outbox.put([{"idempotency_key": f"k{i}", "i": i} for i in range(5)])
    outbox.put([{"idempotency_key": "k1", "i": 99}])  # the same event again: kept once
    rows = outbox.peek(3)
    assert [e["i"] for _, e in rows] == [0, 1, 2]
    outbox.ack(rows[-1][0])
    assert [e["i"] for _, e in outbox.peek(10)] == [3, 4]


def test_run_log_scan_keys_are_shared_between_agents(tmp_path: Path) -> None:
    logs = tmp_path / "jobs" / "a"
    logs.mkdir(parents=True)
    (logs / "1_0_log.out").write_text("step 1\nx NCCL WARN NET/IB : Got completion with error\n")
    first, second = Outbox(tmp_path / "1.sqlite"), Outbox(tmp_path / "2.sqlite")
    pattern = str(tmp_path / "jobs" / "**" / "*.out")
    assert scan_run_logs("gpu001", pattern, first) == 1
    assert scan_run_logs("gpu002", pattern, second) == 1
    assert first.peek(1)[0][1]["idempotency_key"] == second.peek(1)[0][1]["idempotency_key"]
