"""The entrypoint's own Python (`environment.python`), checked at submission as the owner.

The ranks run the user's interpreter as the run's owner; a path they cannot execute, or an
environment without torch or runyard_client, would fail every rank of every attempt. So a
dry run and a submission run it the same way first, through the owner's program
(service/identity/), and refuse it with a 422 naming the field and what is wrong.
"""

from __future__ import annotations

from contract import protocol_advice
from contract.entrypoint import CLIENT_PACKAGE
from service.config import Settings
from service.errors import InvalidSpec
from service.identity.gate import OwnerGate
from service.identity.service import OwnerUnavailable
from service.runs.schemas import RunSpec, ScriptPythonOut
from service.slurm.commands import SlurmError
from service.slurm.owner import RunOwner
from service.worker_protocol.handshake import NEWEST_PROTOCOL, OLDEST_PROTOCOL

FIELD = "environment.python"


def script_python(
    spec: RunSpec, owner: RunOwner | None, settings: Settings
) -> ScriptPythonOut | None:
    """The spec's interpreter as its owner runs it; None when the spec names none. Never
    call it inside a database transaction: it starts the owner's program."""
    if spec.environment is None:
        return None
    python = spec.environment.python
    if owner is None:
        raise InvalidSpec(f"{FIELD}: an environment is checked for the run's owner only")
    try:
        found = OwnerGate(settings).probe_python(owner, python)
    except SlurmError as exc:  # OwnerAccessError among them: sudo refused, no such user
        raise OwnerUnavailable(str(exc)) from exc
    if found.problem is not None:
        raise InvalidSpec(f"{FIELD}: {python} {found.problem}")
    protocol = found.client_protocol
    # The range the service answers workers in (service/worker_protocol/handshake.py): a client
    # outside it would be refused at its first report, on every rank.
    if protocol is None or not OLDEST_PROTOCOL <= protocol <= NEWEST_PROTOCOL:
        spoken = f"{OLDEST_PROTOCOL}..{NEWEST_PROTOCOL}"
        advice = protocol_advice(protocol or 0, OLDEST_PROTOCOL, NEWEST_PROTOCOL)
        raise InvalidSpec(
            f"{FIELD}: {python} has a {CLIENT_PACKAGE} that speaks protocol {protocol}, the "
            f"service {NEWEST_PROTOCOL if OLDEST_PROTOCOL == NEWEST_PROTOCOL else spoken}: "
            f"{advice} (`pip install <runyard repository>/runyard-client` in that environment)"
        )
    return ScriptPythonOut(
        python=python,
        python_version=found.python_version,
        torch_version=found.torch_version,
        client_protocol=protocol,
    )
