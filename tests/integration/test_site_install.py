"""docs/install.md, followed mechanically on the dev cluster as if it were a site, ends with a
run that trains through a GPU falling off the bus.

The site: the dev cluster's Slurm and the machine's Postgres are up; nothing of runyard's is
(a database, folders, a port and kernel-log files of this test's own). The test extracts every
```bash block of the document, in order, and runs them as written: the head node's blocks in
one bash shell (`set -euo pipefail`, a clean environment: PATH without any virtualenv, HOME,
SLURM_CONF), the block marked "on each compute node" once per node, each in a fresh shell that
knows only its agent.env (the dev cluster's nodes share one host, so each node's file stays
where step 7 wrote it instead of being copied to /etc/runyard/agent.env, and
RUNYARD_KERNEL_LOG uses %n for the node's own file). So the clone, the virtualenv, the
settings file, the database, the service, the admin token, the agents' tokens and processes,
`runyard doctor` and the run's submission are the document's commands. The site's choices
are step 1's variables, given in the shell's environment, as a site would export them:
- RUNYARD_SOURCE is this checkout (`git clone` takes its committed HEAD);
- RUNYARD_SYSTEMD=no: the container has no systemd, so the services start the way the
  document gives for such hosts: deploy/'s scripts, which the systemd units also run;
- RUNYARD_SITE_PACKAGES is this test's own environment's site-packages: a fresh virtualenv
  with `pip install -e` of runyard[worker] brings in torch and takes minutes on this machine,
  too long for `make test`; the document's other path (an existing environment that has the
  dependencies: a site's PyTorch module or conda environment) makes the virtualenv, installs
  runyard from the clone into it with pip, and reads the dependencies from there. The service,
  the agents and the workers all run that virtualenv's Python and the clone's code.
- RUNYARD_ACCELERATOR=cpu and RUNYARD_EXPECT_GPUS empty: the dev cluster has no GPUs.
Step 8 (slurm.conf's HealthCheckProgram, Prolog, Epilog) is the one step not taken: it would
change the shared cluster for every later test; test_doctor.py runs those scripts as Slurm
would.

Then the run that step 10 submitted trains; an Xid 79 line is appended to one of its nodes'
kernel log (as the driver writes it); the agent the document started reads it, the service
drains the node, resumes the run from its last checkpoint on other nodes, and it trains on
past that checkpoint (the incident's recovery). Afterwards the node is resumed, the processes
the document started are stopped by their pid files (the run's job cancelled), the database
dropped, and the cluster left as found.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client.api import RunyardClient
from client.devcluster import pg_instance
from client.devcluster.cluster import DevCluster
from client.devcluster.demo import inject_xid_79
from client.devcluster.identity import SERVICE_USER
from client.devcluster.processes import Started
from tests.conftest import ADMIN_UNIX_USER, REPO_ROOT, TEST_DATABASE, wait_for
from tests.integration.conftest import (
    clean_up_test_leftovers,
    committed,
    drain_reason,
    free_port,
    service_state_dir,
    slurm,
)

pytestmark = [pytest.mark.integration, pytest.mark.whole_path, pytest.mark.every_slurm]
DOC = REPO_ROOT / "docs" / "install.md"
EACH_NODE = "<!-- run: on each compute node -->"
SITE_DATABASE = f"{TEST_DATABASE}_site"
INSTALL_TIMEOUT_S = 300


def doc_blocks() -> list[tuple[bool, str]]:
    """Every ```bash block of the document in order, and whether it runs on each node."""
    found = re.findall(
        r"(<!-- run: on each compute node -->\n)?```bash\n(.*?)```", DOC.read_text(), re.S
    )
    return [(bool(mark), block) for mark, block in found]


def site_script(blocks: list[tuple[bool, str]]) -> str:
    """The head node's shell: its blocks as they are; each node's block in a clean shell per
    node that knows its agent.env (the document's RUNYARD_AGENT_ENV) and RUNYARD_SYSTEMD."""
    parts = ["set -euo pipefail", "set -x"]
    for on_each_node, block in blocks:
        if not on_each_node:
            parts.append(block)
            continue
        parts.append(
            'for agent_env in "$RUNYARD_ETC"/nodes/*/agent.env; do\n'
            '  env -i PATH="$PATH" HOME="$HOME" RUNYARD_SYSTEMD="$RUNYARD_SYSTEMD" '
            'RUNYARD_AGENT_ENV="$agent_env" \\\n'
            f"    bash -euo pipefail -c {shlex.quote(block)}\n"
            "done"
        )
    return "\n".join(parts) + "\n"


def clean_path() -> str:
    """The machine's PATH without any virtualenv's bin (a root shell on a site's head node)."""
    dirs = os.environ.get("PATH", "/usr/bin:/bin").split(":")
    return ":".join(d for d in dirs if not (Path(d).parent / "pyvenv.cfg").exists())


def base_python() -> str:
    """The interpreter this test's virtualenv was made from: the site's Python 3.11."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


class Site:
    def __init__(self, root: Path, dev: DevCluster) -> None:
        self.root, self.dev = root, dev
        # The site's Postgres asks every local user for a password, as runyard doctor wants
        # (this machine's own trusts all): one of its own (client/devcluster/pg_instance.py),
        # its database named after this test's, the service's role owning it.
        self.database = pg_instance.Instance(
            root=root / "postgres",
            port=free_port(),
            owner=SERVICE_USER,
            database=SITE_DATABASE,
            role=SERVICE_USER,
            log=root / "postgres.log",
        )
        self.database_table: dict[str, Started] = {}
        self.home, self.etc = root / "shared" / "runyard", root / "etc" / "runyard"
        self.port = free_port()
        self.sudoers = Path(f"/etc/sudoers.d/runyard-site-{TEST_DATABASE}")
        self.log = root / "install.log"
        self.nodes = slurm("sinfo", "-h", "-N", "-p", "train", "-o", "%N", conf=self.conf).split()
        self.nodes = sorted(set(self.nodes))

    @property
    def conf(self) -> str:
        return str(self.dev.slurm_conf)

    def kern_log(self, node: str) -> Path:
        return self.root / "nodes" / node / "kern.log"

    def environment(self) -> dict[str, str]:
        """Step 1's choices, exported as a site's admin would before running the page."""
        return {
            "PATH": clean_path(),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
            "SLURM_CONF": self.conf,
            "RUNYARD_HOME": str(self.home),
            "RUNYARD_SOURCE": str(REPO_ROOT),
            "RUNYARD_DB": self.database.url,
            "RUNYARD_PARTITION": "train",
            "RUNYARD_SERVICE_PORT": str(self.port),
            "RUNYARD_ETC": str(self.etc),
            "RUNYARD_PYTHON": base_python(),
            "RUNYARD_SITE_PACKAGES": sysconfig.get_path("purelib"),
            "RUNYARD_KERNEL_LOG": str(self.root / "nodes" / "%n" / "kern.log"),
            "RUNYARD_AGENT_STATE_ROOT": str(self.root / "agent-state"),
            "RUNYARD_EXPECT_GPUS": "",
            "RUNYARD_ACCELERATOR": "cpu",
            "RUNYARD_SYSTEMD": "no",
            # The service's user is the dev cluster's (it exists already: the page makes it
            # only if absent); its sudoers rule is this site's own file, removed after.
            "RUNYARD_SUDOERS": str(self.sudoers),
            "RUNYARD_ADMIN_UNIX": ADMIN_UNIX_USER,
            # The site's certificate for this host (`hostname -f`), its key and its CA: the
            # dev cluster's own (client/devcluster/tls.py), as a site's CA would issue them.
            "RUNYARD_TLS_CERT": str(self.dev.tls.server_cert),
            "RUNYARD_TLS_KEY": str(self.dev.tls.server_key),
            "RUNYARD_TLS_CA": str(self.dev.tls.ca_cert),
        }

    def install(self) -> str:
        """Run the document; its output (the head shell's, with `set -x`)."""
        script = site_script(doc_blocks())
        (self.root / "install.sh").write_text(script)
        with open(self.log, "w") as out:
            done = subprocess.run(
                ["bash", str(self.root / "install.sh")],
                env=self.environment(),
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=INSTALL_TIMEOUT_S,
            )
        output = self.log.read_text()
        assert done.returncode == 0, f"the install stopped:\n{output[-6000:]}{self.service_log()}"
        return output

    def service_log(self) -> str:
        log = self.home / "state" / "service.log"
        return f"\n--- service.log:\n{log.read_text()[-4000:]}" if log.exists() else ""

    def client(self) -> RunyardClient:
        token = (self.etc / "admin.token").read_text().strip()
        return RunyardClient(self.url, token=token)

    @property
    def url(self) -> str:
        """The public URL step 3 wrote: HTTPS, verified with RUNYARD_CA (slurm_cluster)."""
        return dict(
            line.split("=", 1)
            for line in (self.etc / "runyard.env").read_text().splitlines()
            if line.startswith("RUNYARD_PUBLIC_URL=")
        )["RUNYARD_PUBLIC_URL"]

    def pid_files(self) -> list[Path]:
        """The processes the document started: the service and one agent per node."""
        return [
            self.home / "state" / "service.pid",
            *(self.root / "agent-state").glob("*/agent.pid"),
        ]

    def stop_everything(self) -> None:
        """SIGTERM to each process by the pid the document recorded, then SIGKILL."""
        pids = []
        for pid_file in self.pid_files():
            if pid_file.exists() and pid_file.read_text().strip().isdigit():
                pids.append(int(pid_file.read_text()))
        live = [p for p in pids if alive(p) and str(self.home) in cmdline(p)]
        for pid in live:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while any(alive(p) for p in live) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in [p for p in live if alive(p)]:
            os.kill(pid, signal.SIGKILL)


def uid_of(pid: int) -> int:
    """The real uid of a live process, as the kernel has it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """Running, and not a zombie left to a parent that does not reap (the shell is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def site(slurm_cluster: DevCluster) -> Iterator[Site]:
    # A root the site's users reach (pytest's own temporary root is root's, mode 0700).
    site = Site(service_state_dir("site"), slurm_cluster)
    pg_instance.ensure(site.database, site.database_table, wait_for)  # empty: nothing of ours
    for node in site.nodes:  # the nodes' syslog files
        site.kern_log(node).parent.mkdir(parents=True, exist_ok=True)
        site.kern_log(node).touch()
    try:
        yield site
    finally:
        site.stop_everything()
        clean_up_test_leftovers(slurm_cluster, prefix=f"runyard-{SITE_DATABASE}")
        pg_instance.shut_down(site.database_table[pg_instance.PROCESS_NAME])
        site.sudoers.unlink(missing_ok=True)
        shutil.rmtree(site.root, ignore_errors=True)


def test_install_from_the_docs_then_a_run_survives_an_xid(site: Site) -> None:
    started = time.monotonic()
    output = site.install()
    installed_s = time.monotonic() - started
    blocks = doc_blocks()
    assert len(blocks) >= 9 and sum(on_node for on_node, _ in blocks) == 1

    # What the document started is what runs: the clone's code in the site's virtualenv,
    # as the service's own user, never root; and the doctor (step 9) found it so.
    service_pid = int((site.home / "state" / "service.pid").read_text())
    assert str(site.home / "venv" / "bin" / "python") in cmdline(service_pid)
    assert "-m service.serve" in cmdline(service_pid)
    assert site.url.startswith("https://")
    assert uid_of(service_pid) == pwd.getpwnam(SERVICE_USER).pw_uid != 0
    doctor = [
        str(site.home / "venv" / "bin" / "runyard"),
        "doctor",
        "--json",
        "--only",
        "identity",
        "--only",
        "wire",
        "--settings",
        str(site.etc / "runyard.env"),
    ]
    checked = json.loads(
        subprocess.run(
            doctor, capture_output=True, text=True, timeout=120,
            env={**site.environment(), "RUNYARD_URL": site.url,
                 "RUNYARD_CA": str(site.dev.tls.ca_cert),
                 "RUNYARD_TOKEN": (site.etc / "admin.token").read_text().strip()},
        ).stdout
    )  # fmt: skip
    statuses = {c["name"]: c["status"] for c in checked["checks"]}
    assert statuses == {
        "service user": "ok", "secrets": "ok", "owner group": "ok", "acts as its users": "ok",
        "fault hooks": "ok",  # a site's service hands no RUNYARD_FAULT to jobs
        # Step 3's TLS and the cluster's MUNGE key, as the doctor proves them to the service.
        "plain HTTP off": "ok", "certificate": "ok", "HTTPS verified": "ok",
        "MUNGE here": "ok", "MUNGE key shared": "ok",
    }, checked  # fmt: skip
    agent_pids = sorted((site.root / "agent-state").glob("*/agent.pid"))
    assert [p.parent.name for p in agent_pids] == site.nodes
    for pid_file in agent_pids:
        assert "-m worker.agent" in cmdline(int(pid_file.read_text())), pid_file
    run_id = int(re.findall(r"run (\d+) 'tiny-demo' accepted", output)[-1])

    client = site.client()
    first = wait_for(
        "a committed checkpoint",
        lambda: committed(client, run_id),
        timeout_s=120,
        context=lambda: (client.get_run(run_id)["state_reason"], site.service_log()),
    )[0]
    wait_for("steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first + 3)
    trained_s = time.monotonic() - started
    healthy, bad = client.get_run(run_id)["nodes"]

    inject_xid_79(site.kern_log(bad), pid=os.getpid())
    wait_for(
        f"{bad} drained in Slurm with the Xid in its reason",
        lambda: "xid:79" in drain_reason(bad, site.conf),
        timeout_s=30,
    )
    second = wait_for(
        "attempt 2 running",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][1:] if a["state"] == "RUNNING"),
            None,
        ),
        timeout_s=90,
    )
    assert bad not in second["nodes"] and healthy in second["nodes"]
    assert second["resume_step"] in committed(client, run_id)
    # Recovered once the new attempt trains past its checkpoint (the incident's first step
    # after the signal). Training on to the spec's 200th step would prove nothing more
    # here: a run's end is make test's other whole paths' (10-15 s of this test's ~80).
    incident = wait_for(
        "the Xid's incident to see training again",
        lambda: next(
            (i for i in client.list_incidents() if i["run_id"] == run_id and i["recovery_s"]),
            None,
        ),
        timeout_s=120,
        context=lambda: client.get_run(run_id)["state_reason"],
    )
    assert incident["signal"] == "xid:79" and incident["node_name"] == bad
    resumed = client.get_run(run_id)
    assert resumed["num_hardware_restarts"] == 1 and resumed["state"] == "RUNNING"
    assert (resumed["last_step"] or 0) > second["resume_step"]
    print(
        f"site install: installed {installed_s:.0f} s, training past a commit at "
        f"{trained_s:.0f} s, Xid on {bad} recovered in {incident['recovery_s']:.1f} s, "
        f"at {time.monotonic() - started:.0f} s"
    )
