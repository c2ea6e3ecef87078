"""docs/install.md is followed mechanically: its bash blocks must parse, and every file of
the repository they install must exist. The fast check before the end-to-end one:
tests/integration/test_site_install.py runs the same blocks on the dev cluster as a site
would, and ends with a run that survives an Xid."""

from __future__ import annotations

import re
import subprocess

from service.config import REPO_ROOT

DOC = REPO_ROOT / "docs" / "install.md"


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_every_bash_block_parses() -> None:
    blocks = bash_blocks()
    assert len(blocks) >= 8
    for block in blocks:
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert done.returncode == 0, f"{done.stderr}\n{block}"


def test_the_files_the_doc_installs_exist() -> None:
    text = DOC.read_text()
    named = set(re.findall(r"src/(deploy/[\w.-]+|examples/[\w.-]+|alembic\.ini)", text))
    assert "deploy/runyard.service" in named and "deploy/runyard-agent.service" in named
    for path in named:
        assert (REPO_ROOT / path).exists(), path
    for script in ("runyard-healthcheck.sh", "slurm-prolog.sh", "slurm-epilog.sh"):
        assert (REPO_ROOT / "deploy" / script).stat().st_mode & 0o111, script
