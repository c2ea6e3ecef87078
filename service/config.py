"""Service settings, read from RUNYARD_* environment variables."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_network
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

REPO_ROOT = Path(__file__).resolve().parents[1]


class SlowNodePolicy(StrEnum):
    """What the service does with a node flagged SLOW (service/nodes/stragglers.py)."""

    FLAG = "flag"  # show it (node show, /metrics, the node's history); the run stays
    # Also move the run off it: checkpoint at the next report, drain the node, a spare
    # takes its place (only when a spare is free: waiting for one would cost more).
    MOVE = "move"


class ServiceEnvironment(StrEnum):
    """Whose jobs the service submits: a site's users', or the dev cluster's and the tests'."""

    SITE = "site"
    # The test fault hooks of the service's environment (RUNYARD_FAULT*, worker/faults.py)
    # go into every job it submits (service/identity/gate.py): crashes, slowed steps.
    DEV = "dev"


class Settings(BaseSettings):
    """One source of truth for everything an operator can tune."""

    model_config = SettingsConfigDict(env_prefix="RUNYARD_", extra="ignore")

    database_url: str = Field(
        default="postgresql+psycopg://postgres@127.0.0.1:5432/runyard",
        description="SQLAlchemy URL of the Postgres database that holds all durable state.",
    )
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None,
        description="URL workers and agents use to reach the API (default http://host:port).",
    )
    state_dir: Path = Field(
        default=REPO_ROOT / ".runyard" / "dev",
        description="Root of job folders, logs, checkpoints and the data cache.",
    )
    checkpoint_root: Path | None = Field(
        default=None, description="Where runs write checkpoints (default state_dir/checkpoints)."
    )
    slurm_conf: Path | None = Field(
        default=None, description="SLURM_CONF for sbatch/squeue/scontrol (None: Slurm's default)."
    )
    partition: str = Field(default="train", description="Slurm partition runs are submitted to.")
    reconcile_interval_s: float = Field(
        default=1.0, gt=0, description="How often the reconciler compares Postgres with Slurm."
    )
    default_max_restarts: int = Field(
        default=3,
        ge=0,
        description="Automatic re-submissions of a failed run, unless the spec says.",
    )
    worker_python: str | None = Field(
        default=None, description="Python interpreter on compute nodes (default: the service's)."
    )
    replica_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="Replica groups: how long survivors wait on a dead group's collective or "
        "quorum before stepping without it (torchft's timeout; a 10 s timeout stalled a "
        "two-group toy for about 5 s).",
    )
    lighthouse_command: str = Field(
        default="torchft_lighthouse",
        description="The torchft lighthouse executable the service starts per replica-group "
        "run (a name on PATH or beside the service's Python, or a path).",
    )
    lighthouse_host: str = Field(
        default="127.0.0.1",
        description="The address compute nodes reach this host at for the lighthouse.",
    )
    lighthouse_bind_addr: str | None = Field(
        default=None,
        description="The address lighthouses listen on: one of this host's, on the network "
        "the compute nodes use (default: RUNYARD_LIGHTHOUSE_HOST, where the ranks reach it). "
        "A lighthouse has no authentication, and whoever joins its quorum can make a group "
        "heal from them (torchft unpickles what a peer sends): never 0.0.0.0 or ::.",
    )
    lighthouse_ports: str = Field(
        default="",
        pattern=r"^(\d{1,5}-\d{1,5})?$",
        description="LOW-HIGH: the ports lighthouses listen on (one per replica-group run), "
        "for a firewall rule that lets only the compute nodes reach them; empty: any free "
        "port the kernel picks.",
    )
    run_reconciler: bool = Field(
        default=True, description="Run the background reconcile loop inside the API process."
    )

    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Largest request body accepted (413 above)."
    )
    agent_requests_per_s: float = Field(
        default=20.0, gt=0, description="Sustained requests/s allowed per agent token."
    )
    agent_burst: float = Field(default=100.0, ge=1, description="Requests an agent may burst.")
    auth_cache_ttl_s: float = Field(
        default=60.0,
        ge=0,
        description="How long an authenticated token is remembered (0: read api_tokens on "
        "every request). A revocation through this process applies at once; one through "
        "another process within auth_revocation_poll_s, and within this TTL at worst.",
    )
    auth_revocation_poll_s: float = Field(
        default=1.0, gt=0, description="How often each process reads the tokens revoked."
    )
    stop_grace_s: float = Field(
        default=180.0,
        gt=0,
        description="How long ranks asked to stop (preemption, a segment's end, a slow node, "
        "a cancel) have to save a checkpoint and exit before their jobs are scancelled.",
    )
    segment_stop_margin_s: float = Field(
        default=180.0,
        gt=0,
        description="Stop a time-limited segment this long before its Slurm limit, so it "
        "checkpoints and exits cleanly.",
    )
    accelerator: str = Field(
        default="gpu",
        pattern="^(gpu|cpu)$",
        description="What the workers train on: gpu, or cpu (the dev cluster; no fp8).",
    )
    hardware: str = Field(
        default="h100-sxm", description="GPU type of the cluster, for the planner's admission."
    )
    network: str = Field(default="ib", description="ib or efa, for the planner's admission.")
    live_checkpoint_window_h: float = Field(
        default=168.0,
        gt=0,
        description="The window over which the cluster's observed failures (incidents per "
        "node-hour) set each running run's checkpoint interval (service/runs/"
        "live_interval.py); a week holds tens of failures at 1,000 nodes.",
    )
    classification_file: Path | None = Field(
        default=None,
        description='JSON {"xid:94": "DRAIN_AND_MOVE", ...} overriding rows of the '
        "classification table (service/recovery/classification.py).",
    )
    app_errors_before_drain: int = Field(
        default=3,
        ge=1,
        description="Application-class Xids (13/31/43) on a node before it is drained.",
    )
    heartbeat_suspect_s: float = Field(
        default=10.0, gt=0, description="Silence after which a node with an agent is SUSPECT."
    )
    heartbeat_dead_s: float = Field(
        default=20.0, gt=0, description="Silence after which a node is presumed dead and drained."
    )
    heartbeat_return_s: float = Field(
        default=600.0,
        ge=0,
        description="A node drained only because its agent fell silent returns to service by "
        "itself once the agent has heartbeated this long with no gap over "
        "heartbeat_suspect_s, unless something else holds it out (an Xid, NVML or other "
        "agent-reported fault, another incident, an admin drain, a Slurm drain that is not "
        "runyard's); 0: never, such a node waits for `runyard node resume`. 600 s (30x "
        "heartbeat_dead_s): an agent restart costs the node ten minutes rather than an "
        "on-call's visit, while an agent that keeps dying (a crash loop, a host short of "
        "memory, a flapping link) is not put back under a run every few minutes.",
    )
    hang_factor: float = Field(
        default=20.0, gt=1, description="A run is hung after this many median step times..."
    )
    hang_min_s: float = Field(
        default=30.0, gt=0, description="...and never before this many seconds without a step."
    )
    slow_node_policy: SlowNodePolicy = Field(
        default=SlowNodePolicy.MOVE,
        description="flag: a persistently slow node is shown (node show, /metrics "
        "runyard_node_slow) and left in its run; move: also moved off at once with a "
        "checkpoint, drained, and replaced by a spare. move by default: synchronous training "
        "runs at its slowest rank, so a node 1.25x slow costs every GPU of the run 20% for "
        "as long as it stays, while the move costs one restart and no steps.",
    )
    report_drains_per_run: int = Field(
        default=2,
        ge=0,
        description="A worker's report that names a node (an SDC mismatch, a slow node) is a "
        "claim by the run's own code: at most this many such drains per run within "
        "report_drain_window_s; past it the service opens an incident for the on-call and "
        "drains nothing. Two: a real SDC or slow GPU is rare (1.4% of Llama 3's "
        "interruptions), so a second one inside a day already says more about the run than "
        "about the nodes.",
    )
    report_drain_window_s: float = Field(
        default=86400.0, gt=0, description="The window report_drains_per_run counts over."
    )
    slow_node_margin: float = Field(
        default=1.25,
        gt=1.0,
        description="A node is slow in a report when its slowest rank's update time is above "
        "this x the median of the other nodes' (MegaScale reports stragglers at 1.1-1.5x).",
    )
    slow_node_min_excess_s: float | None = Field(
        default=None,
        ge=0,
        description="...and at least this many seconds above that median, so jitter is not a "
        "straggler. Default by accelerator: 0.001 on GPUs (an update takes about a "
        "millisecond there, timed on the device); 0.1 on cpu, the dev cluster, where ranks "
        "sharing two cores jitter by tens of ms.",
    )
    slow_node_reports: int = Field(
        default=5,
        ge=1,
        description="Consecutive slow reports (each a mean over ~report_interval_s of steps) "
        "before a node is flagged SLOW; one report within the margin clears the count.",
    )
    log_format: Literal["json", "text"] = Field(
        default="json",
        description="Service log lines: one JSON object each (with run, attempt and node ids) "
        "for log shippers, or plain text.",
    )
    run_umask: str = Field(
        default="0027",
        pattern="^0?[0-7]{3}$",
        description="The umask a run's jobs and the files made for them at submission get "
        "(octal): 0027 makes job folders, logs and checkpoints the owner's, readable by "
        "the owner's primary group (the team), and nothing for others.",
    )
    owner_python: str | None = Field(
        default=None,
        description="The Python the service acts as a run's owner with: `sudo -n -u <owner> "
        "<owner_python> -I -m service.identity.as_owner`, the one command the sudoers rule "
        "allows (docs/install.md step 3; default: the service's own Python).",
    )
    owner_group: str = Field(
        default="runyard-users",
        description="The Unix group of the users the service may act as (the sudoers rule's "
        "Runas list): a user is linked only to a login in it.",
    )
    # `runyard login` (service/auth/login.py): a person proves their uid with MUNGE.
    login_token_ttl_s: float = Field(
        default=43200.0,
        gt=0,
        description="How long a `runyard login` token lasts: 12 h, a working day, so one "
        "login in the morning serves the day (as a Kerberos ticket's default 10 h lifetime "
        "does), while a token left behind on a shared login host is dead by the next one. "
        "Tokens admins make for automation keep their own expiry.",
    )
    login_credential_max_age_s: float = Field(
        default=60.0,
        gt=0,
        description="A login's MUNGE credential encoded longer ago than this is refused, even "
        "when munged accepts it (its TTL may be up to munged's --max-ttl, an hour): each "
        "munged remembers the credentials it decoded only within their TTL and only on its "
        "own host, so a copied credential is worth this long at most. `runyard login` "
        "posts its credential within a second of making it; 60 s leaves room for a slow "
        "network and the clock skew between hosts that MUNGE itself tolerates.",
    )
    login_min_uid: int = Field(
        default=1000,
        ge=1,
        description="The lowest uid that may `runyard login`: root (0) never may, and system "
        "accounts (daemons, the service's own user, SlurmUser, munge) sit below 1000 on "
        "Debian and RHEL (UID_MIN). Logins must also be in owner_group.",
    )
    environment: ServiceEnvironment = Field(
        default=ServiceEnvironment.SITE,
        description="site: users' jobs get nothing of the service's environment. dev (the dev "
        "cluster's and the tests' services only): the test fault hooks set in it "
        "(RUNYARD_FAULT*: crashes, slowed steps, flipped values) reach every job it submits. "
        "`runyard doctor` fails a site service that has one set.",
    )
    qos_by_priority: dict[str, str] = Field(
        default_factory=dict,
        description="Slurm QoS per runyard priority class, where the site has them (JSON: "
        '{"prod": "high", "scavenger": "low"}); a class not named gets the account\'s default.',
    )
    job_prefix: str | None = Field(
        default=None,
        description="Prefix of Slurm job names (default runyard-<database>), so two services "
        "sharing one cluster never adopt each other's jobs.",
    )

    # Experiment trackers (service/tracking/): where a run's `tracking:` section is exported.
    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="The site's MLflow tracking server (http://host:5000); None: runs may not "
        "ask for mlflow. `runyard dev up --with mlflow` starts one on Postgres.",
    )
    mlflow_request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="One MLflow request's timeout; a server that does not answer in time is "
        "retried later (the export waits, training never does).",
    )
    wandb_mode: Literal["offline", "online"] = Field(
        default="offline",
        description="offline: W&B runs are written under wandb_dir, for `wandb sync` (no "
        "network from the service); online: sent to W&B (needs WANDB_API_KEY).",
    )
    wandb_dir: Path | None = Field(
        default=None,
        description="Where W&B run folders are written, <dir>/<team>/wandb/ (default: the "
        "service's own folder, state_dir/service/wandb; set a shared folder the teams can "
        "read, so they can `wandb sync` them).",
    )
    wandb_entity: str | None = Field(
        default=None, description="The W&B entity runs log to when their spec names none."
    )
    tensorboard_root: Path | None = Field(
        default=None,
        description="Root of TensorBoard log folders, <root>/<team>/<run id>-<name> (default: "
        "the service's own folder, state_dir/service/tensorboard; set a shared folder the "
        "teams can read, and point TensorBoard at it).",
    )
    tracking_export_interval_s: float = Field(
        default=2.0, gt=0, description="How often the exporters look for new steps and events."
    )
    tracking_retry_max_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest wait between tries of a tracker that fails (doubling from "
        "tracking_export_interval_s).",
    )
    # Notifications (service/notifications/): webhooks delivered from a Postgres outbox.
    notify_interval_s: float = Field(
        default=1.0, gt=0, description="How often the outbox is read for deliveries due."
    )
    notify_timeout_s: float = Field(default=10.0, gt=0, description="One webhook POST's timeout.")
    notify_retry_base_s: float = Field(
        default=2.0,
        gt=0,
        description="First wait before a failed delivery is tried again; doubles per try.",
    )
    notify_retry_max_s: float = Field(
        default=300.0, gt=0, description="Longest wait between two tries of one delivery."
    )
    notify_give_up_after_s: float = Field(
        default=86400.0,
        gt=0,
        description="A delivery not answered 2xx this long after its event is GAVE_UP.",
    )
    webhook_allowed_networks: str = Field(
        default="",
        description="Comma-separated CIDRs webhooks may reach besides public addresses (e.g. "
        "an internal Slack proxy's 10.20.0.0/24). Loopback, link-local (cloud metadata), "
        "private, carrier-grade NAT, multicast and reserved addresses are refused otherwise, "
        "when a notification is added and at each delivery.",
    )
    goodput_low_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="goodput.low is judged only after a run held its nodes this long "
        "(start-up counts as lost time), as the RunyardGoodputLow alert does.",
    )

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _cidrs(cls, text: str) -> str:
        # A typo refuses the service's start, not every delivery to the network it meant.
        for cidr in _split_cidrs(text):
            try:
                ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network (e.g. 10.20.0.0/24): {exc}") from exc
        return text

    @field_validator("lighthouse_ports")
    @classmethod
    def _port_range(cls, text: str) -> str:
        if text:
            low, high = (int(port) for port in text.split("-"))
            if not 1 <= low <= high <= 65535:
                raise ValueError(f"{text!r}: want LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
        return text

    @property
    def webhook_networks(self) -> list[IPv4Network | IPv6Network]:
        """webhook_allowed_networks, parsed (10.20.0.5/24 is taken as 10.20.0.0/24)."""
        return [
            ip_network(cidr, strict=False) for cidr in _split_cidrs(self.webhook_allowed_networks)
        ]

    @property
    def slurm_job_prefix(self) -> str:
        if self.job_prefix:
            return self.job_prefix
        # The database's name, not the URL's tail: a URL may carry a query (the dev
        # cluster's names its password file: ?passfile=...).
        return f"runyard-{make_url(self.database_url).database or 'runyard'}"

    @property
    def slow_node_floor_s(self) -> float:
        """slow_node_min_excess_s, or its default for the accelerator."""
        if self.slow_node_min_excess_s is not None:
            return self.slow_node_min_excess_s
        return 0.1 if self.accelerator == "cpu" else 0.001

    @property
    def api_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @property
    def checkpoints_dir(self) -> Path:
        return self.checkpoint_root or self.state_dir / "checkpoints"

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def data_cache_dir(self) -> Path:
        """Root of the per-user data caches (each user's runs pack and map their own)."""
        return self.state_dir / "data"

    @property
    def service_dir(self) -> Path:
        """The service's own files (lighthouse logs): never in a root users can write to."""
        return self.state_dir / "service"

    @property
    def umask(self) -> int:
        return int(self.run_umask, 8)


def _split_cidrs(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


@lru_cache
def get_settings() -> Settings:
    return Settings()
