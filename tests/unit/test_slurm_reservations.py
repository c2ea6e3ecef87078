"""Deleting a reservation (issue 37): slurmctld's refusal is an error, a reservation that is
gone already is not; which reservations are a run's of ours; the fake refuses as Slurm does."""

from __future__ import annotations

import subprocess

import pytest

from service.slurm import commands
from service.slurm.commands import RESERVATION_BUSY, SlurmError, SlurmUnreachable
from service.slurm.fake import FakeSlurm
from service.slurm.reservations import run_of_reservation, run_reservation, spare_reservation
from service.slurm.target import SlurmTarget

# The Slurm the environment reaches, as the commands' tests have always run them.
LOCAL = SlurmTarget("")

# What scontrol prints on stderr (slurm_perror after "delete_reservation <arg>"), Slurm 22.05.
IN_USE = "delete_reservation reservation=runyard-run7: Requested reservation is in use\n"
GONE = "delete_reservation reservation=runyard-run7: Requested reservation is invalid\n"
NO_ANSWER = "delete_reservation reservation=runyard-run7: Unable to contact slurm controller\n"


class Scontrol:
    """scontrol as the commands run it (commands._run): exits as told, calls recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.returncode, self.stderr = 0, ""

    def says(self, stderr: str) -> None:
        self.returncode, self.stderr = 1, stderr

    def run(self, target: SlurmTarget, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        return subprocess.CompletedProcess(argv, self.returncode, stdout="", stderr=self.stderr)


@pytest.fixture
def scontrol(monkeypatch: pytest.MonkeyPatch) -> Scontrol:
    fake = Scontrol()
    monkeypatch.setattr(commands, "_run", fake.run)
    return fake


def test_a_refused_delete_raises_and_one_already_gone_counts_as_deleted(
    scontrol: Scontrol,
) -> None:
    commands.delete_reservation(LOCAL, "runyard-run7")
    assert scontrol.calls == [["scontrol", "delete", "reservation=runyard-run7"]]
    scontrol.says(IN_USE)
    with pytest.raises(SlurmError, match=RESERVATION_BUSY) as refused:
        commands.delete_reservation(LOCAL, "runyard-run7")
    assert type(refused.value) is SlurmError  # a refusal, not an outage
    scontrol.says(NO_ANSWER)
    with pytest.raises(SlurmUnreachable):
        commands.delete_reservation(LOCAL, "runyard-run7")
    scontrol.says(GONE)
    commands.delete_reservation(LOCAL, "runyard-run7")  # no error: what the delete wanted


def test_only_the_not_found_wording_reads_as_gone() -> None:
    assert commands.reservation_gone(GONE)
    for message in (IN_USE, NO_ANSWER, "Access denied to requested reservation", ""):
        assert not commands.reservation_gone(message), message


def test_only_run_reservations_of_our_prefix_name_a_run() -> None:
    prefix = "runyard-unit"
    assert run_of_reservation(prefix, run_reservation(prefix, 42)) == 42
    for name in (
        spare_reservation(prefix),
        run_reservation("runyard-unit2", 42),  # another service, whose prefix starts with ours
        run_reservation("runyard", 42),
        f"{prefix}-run042",  # not a name run_reservation makes
        f"{prefix}-run",
        f"{prefix}-run42x",
        "maintenance",
    ):
        assert run_of_reservation(prefix, name) is None, name
    assert run_of_reservation("a.b", "a.b-run3") == 3
    assert run_of_reservation("a.b", "axb-run3") is None  # the prefix is text, not a pattern


def test_the_fake_refuses_a_delete_as_often_as_told_then_deletes() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=2)
    slurm.create_reservation("r", ["gpu001"])
    slurm.refuse_reservation_delete("r", times=2)
    for _ in range(2):
        with pytest.raises(SlurmError, match=RESERVATION_BUSY):
            slurm.delete_reservation("r")
        assert slurm.reservations() == {"r": ["gpu001"]}
    slurm.delete_reservation("r")
    assert slurm.reservations() == {}
    slurm.delete_reservation("r")  # gone already: not an error, as with the CLI client
