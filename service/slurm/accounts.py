"""A user's default Slurm account, from the site's accounting (`sacctmgr`).

The site already says which account each person's jobs are charged to when they name none:
their DefaultAccount in slurmdbd. A user who logs in to runyard for the first time is linked
to it (service/auth/login.py), so runyard charges their runs where `sbatch` would.
"""

from __future__ import annotations

from service.slurm.commands import run_slurm, site_target


def parse_default_account(out: str) -> str | None:
    """`sacctmgr show user <login> format=DefaultAccount -nP`: one line with the account, or
    nothing for a user accounting does not know."""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def default_account(login: str) -> str | None:
    """`login`'s DefaultAccount, None where accounting has no such user. Raises SlurmError
    when sacctmgr fails (SlurmUnreachable when slurmdbd does not answer). Never call it
    while a database transaction is open."""
    argv = ["sacctmgr", "show", "user", login, "format=DefaultAccount", "-nP"]
    return parse_default_account(run_slurm(site_target(), argv))
