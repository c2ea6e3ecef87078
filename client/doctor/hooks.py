"""Slurm runs runyard's prolog, epilog and health check as root on every node: whoever can
change one of them, or a file they read, runs code as root there. So every file of theirs
(the scripts Slurm names and this installation's deploy/ scripts, agent-env.sh beside them,
the Python interpreter and the worker/agent modules they run, and this host's agent.env)
must be root's and not writable by its group or anyone else, and so must every folder
above each one, which could otherwise swap the file for another (docs/install.md, "Who a
run runs as"). A sticky folder such as /tmp is fine above a root-owned entry: only root
may rename or remove root's entries in it.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from client.devcluster.paths import REPO_ROOT
from client.doctor.result import Area, Check, SiteSettings, Status, failed, passed
from client.doctor.slurm import show_config

HOOKS = Area.SLURM  # the hooks slurmd runs
SLURM_HOOKS = ("Prolog", "Epilog", "HealthCheckProgram")  # what slurmd runs as root
DEPLOY_HOOKS = ("slurm-hook.sh", "slurm-prolog.sh", "slurm-epilog.sh", "runyard-healthcheck.sh")
AGENT_ENV = Path("/etc/runyard/agent.env")


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _chain(path: Path) -> list[Path]:
    """`path` and every folder above it, as written and as resolved (a link's own folder and
    its target's folders both decide what is read)."""
    seen: dict[Path, None] = {}
    for route in (path.absolute(), path.resolve()):
        for step in (route, *route.parents):
            seen.setdefault(step, None)
    return list(seen)


def who_else_writes(path: Path) -> list[str]:
    """Why someone besides root could change what root reads at `path` ([] if no one)."""
    problems: list[str] = []
    for step in _chain(path):
        try:
            st = step.stat()
        except OSError as exc:
            problems.append(f"{step}: {exc.strerror}")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid != 0:
            problems.append(f"{step} is {_owner(st.st_uid)}'s, not root's")
        sticky_folder = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if mode & 0o022 and not sticky_folder:
            who = "its group" if mode & 0o022 == 0o020 else "everyone"
            problems.append(f"{step} (mode {mode:04o}) is writable by {who}")
    return problems


def configured_hooks(config: dict[str, str]) -> list[Path]:
    """The programs `scontrol show config` says slurmd runs as root (none when unset)."""
    found = []
    for key in SLURM_HOOKS:
        for value in config.get(key, "").split(","):
            if value.strip() and value.strip() != "(null)":
                found.append(Path(value.strip()))
    return found


def hook_files(hooks: Iterable[Path]) -> list[Path]:
    """The hooks and what they read and run: agent-env.sh beside each resolved script, and for
    runyard's deploy/ folder the interpreter and the worker/agent modules it starts."""
    files: dict[Path, None] = {}
    for hook in hooks:
        files.setdefault(hook, None)
        helper = hook.resolve().parent / "agent-env.sh"
        if helper.exists():
            files.setdefault(helper, None)
    for module in sorted((REPO_ROOT / "worker" / "agent").glob("*.py")):
        files.setdefault(module, None)
    files.setdefault(REPO_ROOT / "worker" / "__init__.py", None)
    files.setdefault(Path(sys.executable), None)  # the venv's python the hooks start
    return list(files)


def _verdict(name: str, files: list[Path], fix_what: str) -> Check:
    problems = [p for path in files for p in who_else_writes(path)]
    if not problems:
        return passed(HOOKS, name, f"{len(files)} files and their folders are root's alone")
    unique = list(dict.fromkeys(problems))
    return failed(
        HOOKS,
        name,
        "; ".join(unique[:6]) + (f" (+{len(unique) - 6} more)" if len(unique) > 6 else ""),
        f"chown root: and chmod go-w each named path ({fix_what}): root runs or reads it on "
        "every node, so whoever can write it runs code as root",
    )


def check_hook_files(hooks: list[Path]) -> Check:
    """The hooks, what they read and run, and every folder above them: root's alone."""
    return _verdict("hook files", hook_files(hooks), "docs/install.md step 8")


def check_hooks(settings: SiteSettings, slurm_up: bool = True) -> list[Check]:
    """The hooks' files (those Slurm names, when slurmctld answers, and this installation's
    deploy/ scripts) and this host's agent.env."""
    named = configured_hooks(show_config(settings)) if slurm_up else []
    here = [p for p in named if p.exists()]
    elsewhere = [str(p) for p in named if not p.exists()]
    ours = [REPO_ROOT / "deploy" / name for name in DEPLOY_HOOKS]
    checks = [check_hook_files([*here, *ours])]
    if elsewhere:
        checks.append(
            Check(
                HOOKS,
                "hooks on nodes",
                Status.WARN,
                f"Slurm names {', '.join(elsewhere)}, not on this host",
                "run `runyard doctor --only slurm` on a compute node",
            )
        )
    agent_env = Path(
        settings.extra.get("RUNYARD_AGENT_ENV") or os.environ.get("RUNYARD_AGENT_ENV") or AGENT_ENV
    )
    if not (agent_env.exists() or agent_env.is_symlink()):
        where = f"none on this host ({agent_env}); on a compute node: runyard doctor --only slurm"
        checks.append(passed(HOOKS, "agent.env", where))
    elif agent_env.is_symlink() or not agent_env.is_file():
        checks.append(
            failed(
                HOOKS,
                "agent.env",
                f"{agent_env} is not a plain file: the hooks refuse it",
                "install it as a file: root:runyard-agent, mode 0640 (docs/install.md step 7)",
            )
        )
    else:
        checks.append(_verdict("agent.env", [agent_env], "root:runyard-agent, mode 0640"))
    return checks
