"""Slurm checks: the controller answers, its version, the topology plugin runyard places
runs with, GPU GRES on the partition's nodes, and that this user may create reservations
(the spare pool and preemption hold nodes with them)."""

from __future__ import annotations

import getpass
import os
import re
import subprocess

from client.doctor.result import Area, Check, SiteSettings, Status, failed, passed, skipped
from contract.slurm_features import (
    TESTED_RELEASES,
    SlurmFeature,
    SlurmVersion,
    available_in,
    features_of,
)

# The oldest Slurm runyard is tested on: Debian 12's slurm-wlm (the dev cluster's).
MIN_VERSION = (22, 5)
SLURM = Area.SLURM
# The job and node queries that are JSON where the release allows it (the service's
# adapters, service/slurm, read each the same way).
JSON_QUERIES = (SlurmFeature.SQUEUE_JSON, SlurmFeature.SCONTROL_JSON, SlurmFeature.SACCT_JSON)


def _slurm(settings: SiteSettings, *argv: str, timeout_s: float = 15) -> tuple[int, str]:
    try:
        out = subprocess.run(
            list(argv), capture_output=True, text=True, env=settings.slurm_env(), timeout=timeout_s
        )
    except FileNotFoundError:
        return 127, f"{argv[0]} is not installed"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)} did not answer within {timeout_s:.0f} s"
    return out.returncode, (out.stdout + out.stderr).strip()


def show_config(settings: SiteSettings) -> dict[str, str]:
    """`scontrol show config` as a dict ("TopologyPlugin" -> "topology/tree")."""
    _, text = _slurm(settings, "scontrol", "show", "config")
    pairs = (line.split("=", 1) for line in text.splitlines() if " = " in line)
    return {k.strip(): v.strip() for k, v in pairs}


def parse_version(text: str) -> tuple[int, int] | None:
    """'slurm-wlm 22.05.8' or 'slurm 23.11.4' -> (22, 5)."""
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def controller(settings: SiteSettings) -> Check:
    rc, text = _slurm(settings, "scontrol", "ping")
    if rc == 0 and "UP" in text:
        return passed(SLURM, "controller", text.splitlines()[0])
    where = f"SLURM_CONF={settings.slurm_conf}" if settings.slurm_conf else "Slurm's default conf"
    return failed(
        SLURM,
        "controller",
        f"slurmctld does not answer ({text.splitlines()[-1] if text else rc}; {where})",
        "start slurmctld (`systemctl start slurmctld`) or set RUNYARD_SLURM_CONF to the "
        "cluster's slurm.conf",
    )


def features_text(release: SlurmVersion) -> str:
    """What runyard uses on this release, in a line (contract/slurm_features.py)."""
    used, has = features_of(release), available_in(release)
    json = [f.value for f in JSON_QUERIES if f in used]
    text = [f.value.split()[0] for f in JSON_QUERIES if f not in used]
    parts = [f"JSON from {', '.join(json)}"] if json else []
    if text:
        slower = any(f in has for f in JSON_QUERIES)
        parts.append(
            f"text from {', '.join(text)}"
            + (" (their --json measured slower, not taken)" if slower else "")
        )
    if SlurmFeature.SEGMENT in used:
        parts.append("topology/tree or topology/block (replicas kept in blocks, --segment)")
    else:
        parts.append("topology/tree (topology/block and --segment need 24.05)")
    if SlurmFeature.NODE_STATE_BLOCKED in used:
        parts.append("BLOCKED nodes not free")
    return "; ".join(parts)


def version(settings: SiteSettings) -> Check:
    _, text = _slurm(settings, "scontrol", "--version")
    found = parse_version(text)
    release = SlurmVersion.parse(text)
    if found is None or release is None:
        return failed(SLURM, "version", f"cannot read it: {text}", "install slurm-client")
    shown = str(release)
    tested = release.release in TESTED_RELEASES
    uses = f"Slurm {shown} ({'tested' if tested else 'untested'}): {features_text(release)}"
    if found < MIN_VERSION:
        return Check(
            SLURM,
            "version",
            Status.WARN,
            f"Slurm {shown}, older than the {MIN_VERSION[0]}.{MIN_VERSION[1]:02d} runyard is "
            "tested on",
            "upgrade Slurm, or test runyard on it before relying on recovery",
        )
    if not tested:
        return Check(
            SLURM,
            "version",
            Status.WARN,
            uses,
            f"runyard is tested on Slurm {' and '.join(TESTED_RELEASES)} (docs/install.md); "
            "run its tests against this one before relying on recovery",
        )
    return passed(SLURM, "version", uses)


def topology(settings: SiteSettings, config: dict[str, str]) -> Check:
    plugin = config.get("TopologyPlugin", "")
    if plugin == "topology/block":
        return block_topology(settings)
    if plugin != "topology/tree":
        return failed(
            SLURM,
            "topology",
            f"TopologyPlugin is '{plugin or 'unset'}': runyard cannot keep a run within its "
            "leaf switches",
            "set TopologyPlugin=topology/tree in slurm.conf and describe the switches in "
            "topology.conf (slurm_templates/topology.conf.j2), then `scontrol reconfigure`",
        )
    _, tree = _slurm(settings, "scontrol", "show", "topology")
    switches = [line for line in tree.splitlines() if line.startswith("SwitchName=")]
    if not switches:
        return failed(
            SLURM,
            "topology",
            "topology/tree is set but topology.conf names no switches",
            "describe the leaf switches in topology.conf, then `scontrol reconfigure`",
        )
    leaves = sum(1 for s in switches if "Level=0" in s)
    return passed(SLURM, "topology", f"topology/tree: {len(switches)} switches, {leaves} leaves")


def block_topology(settings: SiteSettings) -> Check:
    """topology/block: the base blocks runyard keeps each model replica inside."""
    _, text = _slurm(settings, "scontrol", "show", "topology")
    lines = [line for line in text.splitlines() if line.startswith("BlockName=")]
    sizes = sorted({t.split("=")[1] for line in lines for t in line.split() if "BlockSize=" in t})
    if not lines:
        return failed(
            SLURM,
            "topology",
            "topology/block is set but topology.conf names no blocks",
            "describe the blocks (BlockName=... Nodes=..., BlockSizes=...) in topology.conf, "
            "then `scontrol reconfigure`",
        )
    return passed(
        SLURM,
        "topology",
        f"topology/block: {len(lines)} blocks of {'/'.join(sizes) or '?'} nodes; each model "
        "replica is kept inside one and asked with --segment",
    )


def gres(settings: SiteSettings, config: dict[str, str]) -> Check:
    rc, text = _slurm(settings, "sinfo", "-h", "-N", "-p", settings.partition, "-o", "%N|%G")
    if rc != 0 or not text:
        return failed(
            SLURM,
            "partition",
            f"partition '{settings.partition}' has no nodes ({text or 'empty'})",
            "create it in slurm.conf or set RUNYARD_PARTITION to the training partition",
        )
    nodes = dict(line.split("|", 1) for line in text.splitlines() if "|" in line)
    without = sorted(n for n, g in nodes.items() if "gpu" not in g)
    if "gpu" not in config.get("GresTypes", "") or without:
        return failed(
            SLURM,
            "gres",
            f"no gpu GRES on {', '.join(without) or 'any node'} (GresTypes="
            f"{config.get('GresTypes', 'unset')})",
            "GresTypes=gpu in slurm.conf, Gres=gpu:N on the NodeName lines, the GPUs in "
            "gres.conf (slurm_templates/gres.conf.j2)",
        )
    return passed(SLURM, "gres", f"gpu GRES on all {len(nodes)} nodes of '{settings.partition}'")


# What scontrol answers a user who may not create reservations: Slurm 22.05 says "Invalid
# user id" (ESLURM_USER_ID_MISSING) to non-operators; other versions "Access/Permission denied".
PERMISSION_WORDS = ("invalid user id", "access denied", "permission denied", "not authorized")


def refused_for_permission(text: str) -> bool:
    return any(word in text.lower() for word in PERMISSION_WORDS)


def reservations(settings: SiteSettings) -> Check:
    """Create and delete a reservation a year from now: the only sure test of permission."""
    name = f"runyard-doctor-{os.getpid()}"
    user = getpass.getuser()
    rc, text = _slurm(
        settings,
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={name}",
        "StartTime=now+365days",
        "Duration=1",
        "NodeCnt=1",
        f"PartitionName={settings.partition}",
        f"Users={user}",
    )
    if rc != 0 and not refused_for_permission(text):
        # Refused for another reason (no node free a year from now, a site policy): the
        # permission itself is untested, which is worth a look but not a failure.
        return Check(SLURM, "reservations", Status.WARN, f"could not test: {text}")
    if rc != 0:
        return failed(
            SLURM,
            "reservations",
            f"{user} may not create reservations: {text}",
            f"run the service as SlurmUser or root, or make {user} a Slurm operator "
            f"(`sacctmgr modify user {user} set adminlevel=operator`)",
        )
    _slurm(settings, "scontrol", "delete", f"ReservationName={name}")
    return passed(SLURM, "reservations", f"{user} may create and delete reservations")


def accounting(config: dict[str, str]) -> Check:
    storage = config.get("AccountingStorageType", "")
    if storage and storage != "accounting_storage/none":
        return passed(SLURM, "accounting", f"{storage}: sacct has runyard's jobs")
    min_age = int(re.sub(r"\D", "", config.get("MinJobAge", "300")) or 300)
    return Check(
        SLURM,
        "accounting",
        Status.WARN,
        f"no accounting: final job states come from slurmctld's memory for MinJobAge={min_age} s",
        "add slurmdbd (AccountingStorageType=accounting_storage/slurmdbd) for sacct, or keep "
        "MinJobAge >= 300 so the service reads each job's end",
    )


def check_slurm(settings: SiteSettings) -> list[Check]:
    first = controller(settings)
    if first.status is Status.FAIL:
        names = ["version", "topology", "gres", "reservations", "accounting"]
        return [first] + [skipped(SLURM, n, "slurmctld unreachable") for n in names]
    config = show_config(settings)
    return [
        first,
        version(settings),
        topology(settings, config),
        gres(settings, config),
        reservations(settings),
        accounting(config),
    ]
