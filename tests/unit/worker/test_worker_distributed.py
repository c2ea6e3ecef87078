"""Launch-environment parsing (pure), the rendezvous port, and what layouts are refused."""

from __future__ import annotations

import pytest

from contract import ParallelLayout
from worker.errors import DoNotRetryError, UnsupportedLayoutError
from worker.launch import (
    PORT_BASE,
    LaunchEnv,
    first_hostname,
    parse_node_addr,
    port_from_job_id,
    read_launch_env,
)
from worker.parallel import ParallelDims, check_supported

# `scontrol show node gpu001 -o` on the dev cluster (Slurm 22.05.8), one line.
SCONTROL_NODE_LINE = (
    "NodeName=gpu001 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.31 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 "
    "NodeHostName=localhost Port=17001 Version=22.05.8 OS=Linux 6.1.0-18-amd64 "
    "RealMemory=4000 AllocMem=0 FreeMem=N/A Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 "
    "TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu CfgTRES=cpu=2,gres/gpu=8\n"
)


def test_parse_node_addr() -> None:
    assert parse_node_addr(SCONTROL_NODE_LINE) == "127.0.0.1"
    assert parse_node_addr("NodeName=gpu017 NodeAddr=10.1.4.17 NodeHostName=gpu017") == "10.1.4.17"
    with pytest.raises(ValueError, match="NodeAddr"):
        parse_node_addr("Node gpu001 not found")


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("gpu001", "gpu001"),
        ("gpu[001-004]", "gpu001"),
        ("gpu[003,007-009],gpu[011-012]", "gpu003"),
        ("cpu7,gpu[001-002]", "cpu7"),
        ("rack[2-3]-gpu[05-08]", "rack2-gpu05"),
    ],
)
def test_first_hostname(nodelist: str, first: str) -> None:
    assert first_hostname(nodelist) == first


def test_port_from_job_id_differs_for_concurrent_jobs_and_avoids_ephemeral_ports() -> None:
    ports = [port_from_job_id(job) for job in range(1000, 1100)]
    assert len(set(ports)) == 100
    assert all(PORT_BASE <= p < 32768 for p in ports)  # Linux ephemeral ports start at 32768
    assert port_from_job_id(123456) == port_from_job_id(123456)


def test_torchrun_env_wins() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node1"}
    env |= {"MASTER_PORT": "29500", "SLURM_PROCID": "0", "SLURM_JOB_ID": "5"}
    assert read_launch_env(env) == LaunchEnv(
        launcher="torchrun",
        rank=3,
        world_size=4,
        local_rank=1,
        master_addr="node1",
        master_port=29500,
        node=read_launch_env(env).node,
    )


SLURM_ENV = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "gpu[001-002]",
    "SLURMD_NODENAME": "gpu002",
    "RUNYARD_MASTER_ADDR": "127.0.0.1",  # skips `scontrol show node`: no slurmctld here
}


def test_slurm_env() -> None:
    assert read_launch_env(SLURM_ENV) == LaunchEnv(
        launcher="slurm",
        rank=2,
        world_size=4,
        local_rank=0,
        master_addr="127.0.0.1",
        master_port=port_from_job_id(4242),
        node="gpu002",
    )


def test_slurm_rank0_off_the_first_node_is_refused() -> None:
    with pytest.raises(DoNotRetryError, match="block distribution"):
        read_launch_env(SLURM_ENV | {"SLURM_PROCID": "0"})


def test_no_launcher_means_one_process() -> None:
    launch = read_launch_env({})
    assert (launch.launcher, launch.rank, launch.world_size) == ("single", 0, 1)


def test_parallel_dims_must_cover_the_world() -> None:
    dims = ParallelDims.from_layout(ParallelLayout(dp=2, tp=4, pp=2), world_size=16)
    # tp innermost (adjacent ranks, one node), then cp, then pp; dp outermost.
    assert list(dims.mesh_dims.items()) == [("dp", 2), ("pp", 2), ("cp", 1), ("tp", 4)]
    assert dims.batch_degree == 2
    with pytest.raises(DoNotRetryError, match="4 were launched"):
        ParallelDims.from_layout(ParallelLayout(dp=2), world_size=4)


def test_fp8_is_refused_without_an_fp8_gpu() -> None:
    """This machine has no CUDA device: fp8 is refused by name, before any collective."""
    with pytest.raises(UnsupportedLayoutError, match=r"precision=fp8 needs .*compute capability"):
        check_supported(ParallelLayout(precision="fp8"))


def test_every_other_layout_is_supported_by_this_worker() -> None:
    for layout in (
        ParallelLayout(dp=8, micro_batch_size=4, precision="bf16"),
        ParallelLayout(tp=2, pp=2, cp=2, zero_stage=3, recompute="full"),
        ParallelLayout(pp=2, vp=2, schedule="interleaved_1f1b", compile=True),
    ):
        check_supported(layout)
