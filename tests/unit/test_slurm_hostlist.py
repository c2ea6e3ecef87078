"""Slurm hostlist syntax in-process: expansion as `scontrol show hostnames` does it, and
compression that expands back to the same hosts."""

from __future__ import annotations

import random

import pytest

from service.slurm.hostlist import HostlistError, compress_hostlist, expand_hostlist


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("", []),
        ("gpu001", ["gpu001"]),
        ("gpu[001-004,007]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu007"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("gpu[099-101]", ["gpu099", "gpu100", "gpu101"]),
        ("a[1-2],b3,c[5]", ["a1", "a2", "b3", "c5"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
        ("login", ["login"]),
    ],
)
def test_expansion_follows_slurm(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("gpu[1-", "without"),
        ("gpu1]", "without"),
        ("gpu[[1]]", "nested"),
        ("gpu[a-b]", "not a number"),
        ("gpu[4-2]", "backwards"),
    ],
)
def test_bad_syntax_is_refused_naming_the_list(bad: str, why: str) -> None:
    with pytest.raises(HostlistError, match=why) as exc:
        expand_hostlist(bad)
    assert repr(bad) in str(exc.value)


def test_compression_is_what_slurm_prints() -> None:
    hosts = ["gpu003", "gpu001", "gpu002", "gpu004", "gpu007", "login"]
    assert compress_hostlist(hosts) == "login,gpu[001-004,007]"
    assert compress_hostlist(["gpu005"]) == "gpu005"
    assert compress_hostlist(["cpu1", "gpu01", "gpu02"]) == "cpu1,gpu[01-02]"
    assert compress_hostlist([]) == ""


def test_round_trips_keep_every_host() -> None:
    rng = random.Random(12)
    for _ in range(200):
        hosts = {
            f"{rng.choice(['gpu', 'n', 'rack1-node'])}{rng.randint(1, 1280):0{rng.choice([1, 4])}d}"
            for _ in range(rng.randint(1, 60))
        }
        compressed = compress_hostlist(hosts)
        expanded = expand_hostlist(compressed)
        assert sorted(expanded) == sorted(hosts), compressed
        assert compress_hostlist(expanded) == compressed


def test_a_full_cluster_compresses_to_one_range() -> None:
    hosts = [f"gpu{i:04d}" for i in range(1, 1281)]
    assert compress_hostlist(reversed(hosts)) == "gpu[0001-1280]"
    assert expand_hostlist("gpu[0001-1280]") == hosts
