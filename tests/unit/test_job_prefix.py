"""The Slurm job prefix a service takes by default: runyard-<its database's name>, so two
services sharing a cluster never adopt each other's jobs, whatever else the URL carries."""

from __future__ import annotations

import pytest

from service.config import Settings


@pytest.mark.parametrize(
    ("url", "prefix"),
    [
        ("postgresql+psycopg://postgres@127.0.0.1:5432/runyard_test", "runyard-runyard_test"),
        # The dev cluster's own Postgres: the URL names its password file, not the secret.
        (
            "postgresql+psycopg://runyard@127.0.0.1:15432/runyard?passfile=/s/service.pgpass",
            "runyard-runyard",
        ),
    ],
)
def test_the_default_prefix_is_the_databases_name(url: str, prefix: str) -> None:
    assert Settings(database_url=url).slurm_job_prefix == prefix
