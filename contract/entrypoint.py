"""A training script of the user's own that runyard launches on every rank instead of its
trainer: a module (`python -m`) or a script file, with its arguments."""

from __future__ import annotations

from pydantic import Field, model_validator

from ._frozen import Frozen


class Entrypoint(Frozen):
    """`python -m <module> <args>` or `python <script> <args>` on every rank, with the
    torch.distributed environment and runyard's (see worker/client.py)."""

    module: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="A module importable on the nodes, run as `python -m module`.",
    )
    script: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A Python file on the shared filesystem, run as `python script`.",
    )
    args: tuple[str, ...] = Field(default=(), max_length=1000, description="Its arguments.")

    @model_validator(mode="after")
    def _one_target(self) -> Entrypoint:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module or script")
        return self

    def argv(self, python: str) -> list[str]:
        """The command line on a rank, with this interpreter."""
        target = ["-m", self.module] if self.module is not None else [str(self.script)]
        return [python, *target, *self.args]
