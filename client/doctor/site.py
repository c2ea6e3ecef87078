"""Postgres (reachable, migrated to head), the shared filesystem (the checkpoint folder
written from compute nodes and read here, its free space) and the agents (every node
heartbeating), each with the fix when it fails."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL, make_url

from client.api import ApiError, RunyardClient
from client.devcluster.paths import REPO_ROOT
from client.doctor.database import bare_conninfo, check_local_users_refused
from client.doctor.result import Area, Check, SiteSettings, Status, failed, passed, skipped

PG, FS, AGENTS, SLURM = Area.POSTGRES, Area.FILESYSTEM, Area.AGENTS, Area.SLURM
PROBE_TIMEOUT_S = 60


def migration_heads() -> set[str]:
    """The newest revision(s) in this checkout's migrations/ folder."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    return set(ScriptDirectory.from_config(config).get_heads())


def check_postgres(settings: SiteSettings) -> list[Check]:
    url = make_url(settings.database_url)
    conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
    where = f"{url.host}:{url.port or 5432}/{url.database}"
    try:
        with psycopg.connect(conninfo, connect_timeout=5) as conn:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    except psycopg.errors.UndefinedTable:
        rows = []
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [
            failed(
                PG,
                "reachable",
                f"cannot connect to {where}: {first}",
                "start Postgres (`systemctl start postgresql`), create the database, and "
                "check RUNYARD_DATABASE_URL",
            ),
            skipped(PG, "migrated", "Postgres unreachable"),
        ]
    reachable = passed(PG, "reachable", where)
    guarded = [_password_required(url), check_local_users_refused(settings.database_url)]
    have, want = {r[0] for r in rows}, migration_heads()
    if have == want:
        migrated = passed(PG, "migrated", f"at head ({', '.join(sorted(want))})")
        return [reachable, *guarded, migrated]
    return [
        reachable,
        *guarded,
        failed(
            PG,
            "migrated",
            f"database at {', '.join(sorted(have)) or 'no revision'}, head is "
            f"{', '.join(sorted(want))}",
            "RUNYARD_DATABASE_URL=... python -m alembic -c alembic.ini upgrade head "
            "(docs/install.md, step 4)",
        ),
    ]


def _password_required(url: URL) -> Check:
    """Postgres must not let the service's role in without its password: whoever connects
    as it can rewrite whom every run runs as (docs/install.md, "The database must not
    trust local users"). Tried from here, the service's host, without the password (nor
    the password file the URL may name: the dev cluster's does)."""
    try:
        with psycopg.connect(
            bare_conninfo(url), password="", passfile="/nonexistent", connect_timeout=5
        ):
            pass
    except psycopg.Error:
        return passed(PG, "password required", f"{url.username} needs its password")
    return Check(
        PG,
        "password required",
        Status.WARN,
        f"Postgres let {url.username} in without a password from this host: anyone who can "
        "reach it as that role can change whom runs run as",
        "give the role a password (scram-sha-256) and remove the trust lines of pg_hba.conf "
        "(docs/install.md); dev cluster: `runyard dev down && runyard dev up` (its own Postgres)",
    )


def _compute_nodes_write(settings: SiteSettings, root: Path) -> Check:
    """One srun task on each of a few nodes Slurm picks writes its name under `root`; this
    host reads them back. A busy cluster is a warning, not a filesystem problem."""
    probe = root / f".runyard-doctor-{uuid.uuid4().hex[:8]}"
    me = '"$SLURMD_NODENAME"'
    script = f"echo {me}; mkdir -p {probe} && echo {me} > {probe}/{me}"
    argv = ["srun", "-p", settings.partition, "-N", str(settings.probe_nodes)]
    argv += ["--ntasks-per-node=1", "--immediate=10", "--time=1", "--chdir=/tmp"]
    argv += ["-J", "runyard-doctor", "sh", "-c", script]
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, env=settings.slurm_env(), timeout=PROBE_TIMEOUT_S
        )
        ran, said = sorted(set(out.stdout.split())), out.stderr.strip().splitlines()
    except subprocess.TimeoutExpired:
        ran, said = [], [f"srun did not finish within {PROBE_TIMEOUT_S} s"]
    wrote = {n for n in ran if (probe / n).is_file() and (probe / n).read_text().strip() == n}
    with contextlib.suppress(OSError):
        shutil.rmtree(probe)
    if not ran:
        why = said[-1] if said else "no task ran"
        return Check(FS, "written from nodes", Status.WARN, f"no node to probe from: {why}")
    missing = [n for n in ran if n not in wrote]
    if missing:
        return failed(
            FS,
            "written from nodes",
            f"{', '.join(missing)} could not write {root} ({said[-1] if said else 'no error'})",
            f"mount {root} read-write on every compute node (the same path as here)",
        )
    return passed(FS, "written from nodes", f"{', '.join(ran)} wrote files this host read")


def check_filesystem(settings: SiteSettings, slurm_up: bool) -> list[Check]:
    root = settings.checkpoint_root
    name = "checkpoints"
    if not root.is_dir():
        return [
            failed(FS, name, f"{root} does not exist", f"mkdir -p {root} on the shared filesystem"),
            skipped(FS, "free space", "no checkpoint folder"),
            skipped(FS, "written from nodes", "no checkpoint folder"),
        ]
    probe = root / f".runyard-doctor-{uuid.uuid4().hex[:8]}"
    try:
        probe.write_text("ok")
        probe.unlink()
        here = passed(FS, name, f"{root} writable from this host")
    except OSError as exc:
        here = failed(
            FS,
            name,
            f"{root} not writable: {exc.strerror or exc}",
            f"remount {root} read-write, or point RUNYARD_CHECKPOINT_ROOT at a writable "
            "shared folder",
        )
    free_gb = shutil.disk_usage(root).free / 1e9
    space = Check(
        FS,
        "free space",
        Status.OK if free_gb >= settings.min_free_gb else Status.WARN,
        f"{free_gb:.0f} GB free (want >= {settings.min_free_gb:.0f} GB)",
        "" if free_gb >= settings.min_free_gb else f"free space under {root}",
    )
    if here.status is Status.FAIL or not slurm_up:
        because = "not writable from this host" if slurm_up else "slurmctld unreachable"
        return [here, space, skipped(FS, "written from nodes", because)]
    return [here, space, _compute_nodes_write(settings, root)]


def _age_s(stamp: str | None) -> float | None:
    if not stamp:
        return None
    seen = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=UTC)
    return (datetime.now(UTC) - seen).total_seconds()


def check_agents(settings: SiteSettings, client: RunyardClient | None = None) -> list[Check]:
    client = client or settings.client()
    try:
        client.health()
        nodes = client.list_nodes()
    except ApiError as exc:
        fix = (
            "set RUNYARD_TOKEN to an admin or user token (`runyard admin token create`)"
            if exc.status in (401, 403)
            else "start the service (`systemctl start runyard`) and check RUNYARD_URL"
        )
        return [
            failed(AGENTS, "service", f"{settings.service_url}: {exc.message}", fix),
            skipped(AGENTS, "heartbeats", "service unreachable"),
        ]
    service = passed(AGENTS, "service", f"{settings.service_url} answers")
    if not nodes:
        return [
            service,
            failed(
                AGENTS,
                "heartbeats",
                "the service knows no nodes yet",
                "check the service's log: its reconciler reads the nodes from Slurm",
            ),
        ]
    limit = settings.heartbeat_max_age_s
    several = len({n.get("cluster") for n in nodes}) > 1  # node names repeat across clusters
    ages = {
        (f"{n['cluster']}/{n['name']}" if several else n["name"]): _age_s(
            n.get("last_heartbeat_at")
        )
        for n in nodes
    }
    never = sorted(n for n, a in ages.items() if a is None)
    stale = sorted(n for n, a in ages.items() if a is not None and a > limit)
    if not never and not stale:
        return [service, passed(AGENTS, "heartbeats", f"all {len(nodes)} nodes within {limit:g} s")]
    parts = [f"silent for {ages[n]:.0f} s: {n}" for n in stale]
    parts += [f"never heard from: {', '.join(never)}"] if never else []
    return [
        service,
        failed(
            AGENTS,
            "heartbeats",
            "; ".join(parts),
            "on each node: `systemctl restart runyard-agent`, then `journalctl -u "
            "runyard-agent` (token, RUNYARD_URL); docs/install.md step 7",
        ),
    ]


def check_clusters(settings: SiteSettings, client: RunyardClient | None = None) -> list[Check]:
    """Each further cluster the service drives (a clusters file): its controller answers
    the service, and with which Slurm. The local one is the Slurm area's own checks; a
    site of one cluster gets none of these. The service asks each (GET /v1/clusters), as
    it reaches them: `-M` through the shared slurmdbd, or a slurm.conf of their own."""
    client = client or settings.client()
    try:
        clusters = client.list_clusters()
    except ApiError:
        return []  # the agents area says what is wrong with the service
    if len(clusters) < 2:
        return []
    checks = []
    for cluster in clusters:
        name = f"cluster {cluster['name']}"
        if cluster["state"] == "reachable":
            nodes = f"{cluster['num_healthy']}/{cluster['num_nodes']} nodes healthy"
            checks.append(passed(SLURM, name, f"Slurm {cluster['slurm_version']}, {nodes}"))
            continue
        since = cluster.get("unreachable_since")
        when = f" since {since[:19].replace('T', ' ')} UTC" if since else ""
        checks.append(
            failed(
                SLURM,
                name,
                f"its slurmctld does not answer the service{when}: {cluster['detail']}",
                f"check that cluster's slurmctld and `sinfo -M {cluster['name']}` from the "
                "service's host as its user; its runs fail over past RUNYARD_FAILOVER_AFTER_S "
                "(docs/install.md, Several Slurm clusters)",
            )
        )
    return checks
