"""Whether a run's owner can train in the Python their spec names (`environment.python`).

`probe` runs in the owner's program (service/identity/as_owner.py), so the OS answers with
the owner's rights: the interpreter exists, the owner may execute it, and run by them it
imports torch and runyard_client. The service itself never stats or starts a user's
interpreter. `answer_of` reads that answer back in the service: it comes from a process the
owner starts, so each value is checked before it is shown or compared.

No service imports here besides the contract: the owner's program imports this per request.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import subprocess
from dataclasses import dataclass
from typing import Any

from contract.entrypoint import CLIENT_PACKAGE, script_python_environment

# What the interpreter is asked: its version, torch's and the client's protocol, one line.
PROBE = (
    f"import sys, torch, {CLIENT_PACKAGE}; "
    f"print(sys.version.split()[0], torch.__version__, {CLIENT_PACKAGE}.PROTOCOL_VERSION)"
)
# Importing torch from a cold shared filesystem takes tens of seconds on a busy cluster.
PROBE_TIMEOUT_S = 60.0
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")
VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")


def probe(python: str, timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """As the owner: {"problem": <what is wrong, in words>} or the three versions the
    interpreter printed. The checks go from the cheapest to the interpreter's own start."""
    user = pwd.getpwuid(os.geteuid()).pw_name
    try:
        found = os.stat(python)
    except FileNotFoundError:
        return {"problem": "does not exist"}
    except PermissionError as exc:
        return {"problem": f"is not reachable by {user} ({exc.strerror} on a folder above it)"}
    except OSError as exc:
        return {"problem": f"cannot be read by {user}: {exc.strerror}"}
    if not stat.S_ISREG(found.st_mode):
        return {"problem": "is not a file"}
    if not os.access(python, os.X_OK):
        return {"problem": f"is not executable by {user}"}
    try:
        done = subprocess.run(
            [python, "-c", PROBE],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            cwd="/",  # nothing of a working directory on the import path
            # What the ranks run it with (worker/entrypoint.py): runyard's own folder is
            # not importable there, so it must not be here either.
            env=script_python_environment(os.environ, python),
        )
    except subprocess.TimeoutExpired:
        return {"problem": f"did not import torch and {CLIENT_PACKAGE} within {timeout_s:.0f} s"}
    except OSError as exc:  # a script whose interpreter line names a missing program, ...
        return {"problem": f"cannot be run by {user}: {exc.strerror}"}
    if done.returncode != 0:
        return {"problem": import_problem(done.stderr)}
    lines = done.stdout.strip().splitlines()
    words = lines[-1].split() if lines else []
    if len(words) != 3:
        return {"problem": f"did not answer as a Python interpreter: {_quote(done.stdout)}"}
    return {"python_version": words[0], "torch_version": words[1], "protocol": words[2]}


def import_problem(stderr: str) -> str:
    """Why the probe failed, from the interpreter's traceback."""
    missing = MISSING_MODULE.search(stderr)
    module = missing.group(1).split(".")[0] if missing else None
    if module == "torch":
        return "lacks torch (No module named 'torch'): install torch in that environment"
    if module == CLIENT_PACKAGE:
        return (
            f"lacks {CLIENT_PACKAGE} (No module named '{CLIENT_PACKAGE}'): `pip install "
            "<runyard repository>/runyard-client` in that environment"
        )
    lines = [line for line in stderr.splitlines() if line.strip()]
    return f"failed to import torch and {CLIENT_PACKAGE}: {_quote(lines[-1] if lines else '')}"


@dataclass(frozen=True)
class ProbedPython:
    """The owner's interpreter as it answered: `problem` (in words) or its versions."""

    problem: str | None = None
    python_version: str = ""
    torch_version: str = ""
    client_protocol: int | None = None


def answer_of(answer: object) -> ProbedPython:
    """The owner's program's answer, each value checked: it could carry anything."""
    if not isinstance(answer, dict):
        return ProbedPython(problem="gave no answer")
    if answer.get("problem"):
        return ProbedPython(problem=_quote(str(answer["problem"])))
    python_version, torch_version = (
        str(answer.get("python_version")),
        str(answer.get("torch_version")),
    )
    protocol = str(answer.get("protocol"))
    if not (VERSION.fullmatch(python_version) and VERSION.fullmatch(torch_version)):
        found = _quote(f"{python_version} {torch_version}")
        return ProbedPython(problem=f"answered '{found}', not a Python and a torch version")
    if not protocol.isdigit() or len(protocol) > 6:
        return ProbedPython(
            problem=f"has a {CLIENT_PACKAGE} whose PROTOCOL_VERSION is {_quote(protocol)!r}, "
            "not a number"
        )
    return ProbedPython(None, python_version, torch_version, int(protocol))


def _quote(text: str, limit: int = 300) -> str:
    """Output of the owner's program as one printable line of at most `limit` characters."""
    flat = " ".join(text.split())
    return "".join(c if c.isprintable() else "?" for c in flat)[:limit]
