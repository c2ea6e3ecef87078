"""No function in service/, worker/ or client/ is longer than 80 lines (issue 43), as
scripts/longest_functions.py counts them: from the def line to the body's last line,
decorators left out, docstring in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "longest_functions.py"
MAX_LINES = 80
CHECKED = ("service", "worker", "client", "runyard-client")


def longest_functions(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )


def test_no_function_in_service_worker_or_client_is_longer_than_the_limit() -> None:
    done = longest_functions("--max", str(MAX_LINES), *CHECKED)
    assert done.returncode == 0, done.stderr


def test_lengths_count_the_docstring_and_not_the_decorators(tmp_path: Path) -> None:
    (tmp_path / "sample.py").write_text(
        "import functools\n"
        "\n"
        "\n"
        "@functools.cache\n"
        "@functools.wraps(print)\n"
        "def decorated():\n"
        '    """Two lines\n'
        '    of docstring."""\n'
        "    return 1\n"
        "\n"
        "\n"
        "class Holder:\n"
        "    def method(self):\n"
        "        def inner():\n"
        "            return 2\n"
        "\n"
        "        return inner()\n"
    )
    done = longest_functions(str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert [(int(n), where.rsplit(":", 1)[1], name) for n, where, name in rows] == [
        (5, "13", "Holder.method"),
        (4, "6", "decorated"),
        (2, "14", "Holder.method.inner"),
    ]


def test_a_function_over_the_limit_fails_and_is_named(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    (tmp_path / "long.py").write_text(f"def five_and_one():\n{body}")
    assert longest_functions("--max", "6", str(tmp_path)).returncode == 0
    done = longest_functions("--max", "5", str(tmp_path))
    assert done.returncode == 1
    assert "long.py:1  five_and_one" in done.stderr
