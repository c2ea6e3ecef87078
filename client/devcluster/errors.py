"""The dev cluster's one error, below every module of it that raises it."""

from __future__ import annotations


class DevClusterError(RuntimeError):
    """The dev cluster could not be brought up; the message says what to do."""
