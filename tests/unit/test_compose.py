"""docker-compose.yml without a Docker engine: the file is valid for Compose, and every
program a container runs (command, health check, entry-point scripts) is in its image.

"In its image" is decided from what the image is made of, not guessed: Debian packages
(docker/Dockerfile installs on bookworm; `dpkg -S` on this bookworm machine says which
package ships a program, and `apt-cache depends` what the installed ones pull in), the
project's virtualenv (console scripts and `python -m` modules of runyard and its
dependencies), and the repository's own scripts, copied to /opt/runyard.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
from functools import cache
from typing import Any

import pytest
import yaml

from tests.conftest import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
DOCKERFILE = REPO_ROOT / "docker" / "Dockerfile"
IN_IMAGE_REPO = "/opt/runyard/"
# Images we do not build: what their own Dockerfiles install. The official postgres image
# installs Debian's postgresql-<major> with its bin folder on PATH (pg_isready, postgres).
UPSTREAM = {"postgres": {"pg_isready", "postgres", "psql"}}
SHELL_WORDS = set(
    subprocess.run(["bash", "-c", "compgen -b -k"], capture_output=True, text=True).stdout.split()
)


def compose_command() -> list[str]:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
    ):
        return [docker, "compose"]
    if legacy := shutil.which("docker-compose"):
        return [legacy]
    pytest.fail("no Compose client: `apt-get install docker-compose` (scripts/bootstrap.sh)")


@cache
def resolved() -> dict[str, Any]:
    """The file as Compose itself reads it (schema-checked, anchors merged), offline."""
    out = subprocess.run(
        [*compose_command(), "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout)


@cache
def apt_packages() -> set[str]:
    """Packages docker/Dockerfile installs, with everything they depend on."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    listed = re.search(r"apt-get install ([^&]+)", text)
    assert listed, "docker/Dockerfile installs no Debian packages"
    names = [w for w in listed.group(1).split() if not w.startswith("-")]
    out = subprocess.run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            *names,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {ln.strip().split(":")[0] for ln in out.splitlines() if not ln.startswith(" ")} | set(
        names
    )


@cache
def base_packages() -> set[str]:
    """What every Debian image has: the Essential and Priority: required packages."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Essential} ${Priority}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {ln.split()[0] for ln in out.splitlines() if " yes " in ln or ln.endswith("required")}


@cache
def runyard_distributions() -> set[str]:
    """runyard and everything its base and worker dependencies pull in, by name."""
    seen: set[str] = set()
    todo = ["runyard"]
    while todo:
        name = re.split(r"[ ;<>=!~\[]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req and 'extra == "worker"' not in req:
                continue  # dev and other extras are not installed in the image
            todo.append(req)
    return seen


def in_venv(program: str) -> bool:
    if program in ("python", "python3", "pip"):
        return True
    return any(
        ep.name == program and (ep.dist is None or ep.dist.name.lower() in runyard_distributions())
        for ep in md.entry_points(group="console_scripts")
    )


@cache
def in_debian_image(program: str) -> bool:
    found = shutil.which(program)
    if found is None:
        return False
    # dpkg knows a program by the path its package ships: on a merged-/usr system that may
    # be /bin for /usr/bin, and behind an alternatives link (slurmd -> slurmd-wlm) the target.
    others = [f"{d}/{program}" for d in ("/bin", "/sbin", "/usr/bin", "/usr/sbin")]
    for path in (found, *others, os.path.realpath(found)):
        owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
        if owner.returncode == 0:
            packages = {p.split(":")[0].strip() for p in owner.stdout.split(": ")[0].split(",")}
            return bool(packages & (apt_packages() | base_packages()))
    return False


def programs_in_shell(text: str, functions: frozenset[str] = frozenset()) -> list[str]:
    """First words of the simple commands in a shell snippet (functions and builtins left
    out), good enough for the entry points' straight-line scripts."""
    text = re.sub(r"#.*", "", text.replace("\\\n", " "))
    text = re.sub(r"\$\{[^}]*\}|\d*>&\d+", " ", text)  # ${...} expansions, >&2 redirections
    functions = functions | set(re.findall(r"^(\w+)\(\)", text, re.M))
    substituted = re.findall(r"\$\(([^()]*)\)", text)  # $(cmd): a command of its own
    text = re.sub(r"\$\(([^()]*)\)", "SUBSTITUTED", text)
    found = []
    for part in re.split(
        r"&&|\|\||[;|&\n]|\bthen\b|\bdo\b|\belse\b", text + "\n" + "\n".join(substituted)
    ):
        words = [w for w in shlex.split(part, posix=True) if not re.match(r"^\w+=", w)]
        while words and words[0] in ("exec", "!"):
            words = words[1:]
        if words and words[0] == "runuser" and "--" in words:
            found.append("runuser")
            words = words[words.index("--") + 1 :]
        if not words or words[0] in SHELL_WORDS or words[0] in functions:
            continue
        if re.match(r"^[\w./][\w./-]*$", words[0]):
            found.append(words[0])
        if words[0] in ("python", "python3") and words[1:2] == ["-m"]:
            found.append(f"python -m {words[2]}")
    return found


def provided(program: str, image: str) -> bool:
    if image in UPSTREAM:
        return program in UPSTREAM[image]
    if program.startswith("python -m "):
        module = program.removeprefix("python -m ")
        spec = importlib.util.find_spec(module)
        return spec is not None
    if program.startswith(IN_IMAGE_REPO):
        local = REPO_ROOT / program.removeprefix(IN_IMAGE_REPO)
        return local.is_file() and bool(local.stat().st_mode & 0o111)
    return in_venv(program) or in_debian_image(program)


def service_programs(service: dict[str, Any]) -> list[str]:
    programs: list[str] = []
    if command := service.get("command"):
        words = command if isinstance(command, list) else shlex.split(command)
        programs.append(words[0])
        if words[0].startswith(IN_IMAGE_REPO) and words[0].endswith(".sh"):
            script = REPO_ROOT / words[0].removeprefix(IN_IMAGE_REPO)
            sourced = re.findall(r"^source (\S+)", script.read_text(), re.M)
            paths = [script, *(REPO_ROOT / s.removeprefix(IN_IMAGE_REPO) for s in sourced)]
            texts = [p.read_text() for p in paths]
            functions = frozenset(re.findall(r"^(\w+)\(\)", "\n".join(texts), re.M))
            for text in texts:
                programs += programs_in_shell(text, functions)
    test = (service.get("healthcheck") or {}).get("test") or []
    if test[:1] == ["CMD"]:
        programs.append(test[1])
    elif test[:1] == ["CMD-SHELL"]:
        programs += programs_in_shell(test[1])
    return programs


def test_compose_file_is_valid_and_complete() -> None:
    config = resolved()
    services = config["services"]
    assert {"postgres", "slurmctld", "service"} <= set(services)
    nodes = [name for name in services if re.fullmatch(r"gpu\d{3}", name)]
    assert len(nodes) >= 2
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            assert source in config["volumes"], f"{name}: {source} is not a named volume"
    assert services["service"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for node in nodes:
        assert services[node]["hostname"] == node  # Slurm reaches each node by its name


@pytest.mark.heavy  # every image's contents: 8.5 s, make test-all
def test_every_program_a_container_runs_is_in_its_image() -> None:
    missing = []
    for name, service in resolved()["services"].items():
        image = "runyard" if "build" in service else service["image"].split(":")[0]
        for program in service_programs(service):
            if not provided(program, image):
                missing.append(f"{name}: {program}")
    assert not missing, "not in the image: " + ", ".join(missing)
    # The check itself sees what the scripts run (a broken parser would pass everything).
    programs = service_programs(resolved()["services"]["gpu001"])
    assert {"slurmd", "munged", "mknod", "python -m worker.agent", "runyard"} <= set(programs)


def test_the_check_catches_a_program_the_image_lacks() -> None:
    assert not provided("nvidia-smi", "runyard")  # not in Debian's main archive
    assert not provided("pytest", "runyard")  # a dev extra, not installed in the image
    assert not provided("python -m no_such_module", "runyard")
