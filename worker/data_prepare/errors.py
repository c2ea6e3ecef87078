"""The one error `runyard data prepare` raises for bad input: the CLI prints it as one line."""

from __future__ import annotations


class PrepareError(Exception):
    """An input, a tokenizer folder or an output folder that cannot be prepared, with what to
    do about it. Raised in a pool process too, so it stays picklable: one message argument."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
