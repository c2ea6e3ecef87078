"""The torchft lighthouse listens on one address, never on all of them (issue 38, finding 7):
the address the ranks reach it at by default, RUNYARD_LIGHTHOUSE_BIND_ADDR when set, and a
port of RUNYARD_LIGHTHOUSE_PORTS when a site's firewall names a range. The last test starts
the real lighthouse and reads the kernel's table of listening sockets."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import pytest

from service.config import Settings
from service.recovery import lighthouse
from tests.conftest import wait_for


def settings(tmp_path: Path, **values: str) -> Settings:
    return Settings(state_dir=tmp_path, **values)  # type: ignore[arg-type]


def bind_of(argv: list[str]) -> str:
    return argv[argv.index("--bind") + 1]


def test_the_lighthouse_binds_the_address_the_ranks_reach(tmp_path: Path) -> None:
    site = settings(tmp_path, lighthouse_host="10.20.0.5")
    argv = lighthouse.lighthouse_argv(site, 2, 29600)
    assert bind_of(argv) == "10.20.0.5:29600" and "[::]:29600" not in argv
    assert argv[argv.index("--min_replicas") + 1] == "2"


def test_the_bind_address_setting_wins(tmp_path: Path) -> None:
    site = settings(tmp_path, lighthouse_host="head.cluster", lighthouse_bind_addr="10.20.0.5")
    assert bind_of(lighthouse.lighthouse_argv(site, 1, 29600)) == "10.20.0.5:29600"
    site = settings(tmp_path, lighthouse_bind_addr="fd00:20::5")
    assert bind_of(lighthouse.lighthouse_argv(site, 1, 29600)) == "[fd00:20::5]:29600"


def test_ports_come_from_the_sites_range(tmp_path: Path) -> None:
    site = settings(tmp_path, lighthouse_host="127.0.0.1", lighthouse_ports="29601-29603")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 29601 + 7 % 3))  # run 7's first choice
        assert lighthouse._free_port(site, 7) in {29601, 29602, 29603} - {29602}
    with pytest.raises(ValueError, match="LOW-HIGH"):
        settings(tmp_path, lighthouse_ports="29700-29600")


def listening(port: int) -> set[str]:
    """The local addresses with a socket listening on `port` (/proc/net/tcp{,6}, state 0A)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_a_started_lighthouse_listens_on_its_bind_address_only(tmp_path: Path) -> None:
    site = settings(tmp_path, lighthouse_host="127.0.0.1")
    addr, pid = lighthouse.start(site, 1, 1, None)
    port = int(addr.rsplit(":", 1)[1])
    try:
        found = wait_for("the lighthouse to listen", lambda: listening(port) or None, 10)
        # 0100007F: 127.0.0.1 as the kernel prints it; never 00000000 or the IPv6 any.
        assert found == {"0100007F"}, found
        assert addr == f"http://127.0.0.1:{port}"
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
