"""How a worker's exit tells the service whether another attempt can help."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Worker exit codes the service acts on (exit codes alone lie: see docs/design.md)."""

    OK = 0
    RETRYABLE = 1  # anything unexpected: hardware, network, a killed peer
    DO_NOT_RETRY = 3  # bad spec or a code bug: recovery must not burn spares on it
