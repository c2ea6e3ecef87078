"""The CLI against the real service: tables, --json, and clear errors with exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from client.cli import app
from client.devcluster.cluster import DevCluster
from client.output import Exit
from service.slurm.topology import parse_topology
from tests.conftest import wait_for
from tests.integration.conftest import ServiceProcess, slurm, tiny_spec

pytestmark = pytest.mark.integration
runner = CliRunner()


def cli(service: ServiceProcess, *args: str) -> tuple[int, str]:
    env = {"RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token}
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.output


# make test-all's: make test's CLI path is test_login's (`runyard login`, `token list`,
# `run submit` and `run list` as alice) and the Trainer's (`run watch` to the end).
def test_submit_list_show_and_nodes(
    service: ServiceProcess, tmp_path: Path, slurm_cluster: DevCluster
) -> None:
    spec = tmp_path / "run.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec("from-cli", steps=20, checkpoint_every=10)))
    code, out = cli(service, "run", "submit", str(spec), "--dry-run", "--json")
    assert code == 0, out
    decided = json.loads(out)
    code, out = cli(service, "run", "list", "--json")
    assert "from-cli" not in [r["name"] for r in json.loads(out)["items"]]  # nothing created
    code, out = cli(service, "run", "submit", str(spec), "--json")
    assert code == 0, out
    run_id = json.loads(out)["id"]
    assert json.loads(out)["layout"] == decided["layout"]

    code, out = cli(service, "run", "list", "--json")
    assert code == 0 and run_id in [r["id"] for r in json.loads(out)["items"]]
    code, out = cli(service, "run", "show", str(run_id))
    assert code == 0 and "from-cli" in out
    assert f"dp={decided['layout']['dp']} " in out and "(planned)" in out

    code, out = cli(
        service, "run", "watch", str(run_id), "--interval-s", "0.5", "--timeout-s", "120"
    )
    assert code == 0, out
    assert f"run {run_id} SUCCEEDED" in out, out
    # Into a pipe, watch prints a progress line whenever the step moved: rising steps, up
    # to the last one, each with a loss.
    shown = [int(step) for step in re.findall(r"step +(\d+)/20  loss \d+\.\d{4} ", out)]
    assert shown and shown == sorted(set(shown)) and shown[-1] == 20, out
    code, out = cli(service, "run", "checkpoints", str(run_id), "--json")
    assert [c["step"] for c in json.loads(out) if c["state"] == "COMMITTED"] == [10, 20]

    nodes = wait_for(
        "nodes synced from Slurm", lambda: json.loads(cli(service, "node", "list", "--json")[1])
    )
    assert {n["name"] for n in nodes} >= {"gpu001", "gpu008"}
    # The leaf switches (22.05's tree) or blocks (24.11's topology/block) Slurm names.
    topology = parse_topology(
        slurm("scontrol", "show", "topology", conf=str(slurm_cluster.slurm_conf))
    )
    assert {n["switch"] for n in nodes} == set(topology.group_of.values()) != set()


def test_refusals_are_one_line_with_a_nonzero_exit(service: ServiceProcess, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    # dp pinned to the 2 ranks: 7 sequences cannot split (left on auto, the planner pipelines).
    bad.write_text(yaml.safe_dump({**tiny_spec("x"), "global_batch": 7, "parallelism": {"dp": 2}}))
    code, out = cli(service, "run", "submit", str(bad))
    assert code == Exit.ERROR
    assert "global_batch" in out and "Traceback" not in out

    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("name: [unclosed")
    code, out = cli(service, "run", "submit", str(not_yaml))
    assert code == Exit.USAGE and "not valid YAML" in out

    code, out = cli(service, "run", "show", "424242")
    assert code == Exit.ERROR and "no run with id 424242" in out


def test_unreachable_service_says_how_to_fix_it() -> None:
    result = runner.invoke(app, ["run", "list"], env={"RUNYARD_URL": "http://127.0.0.1:9"})
    assert result.exit_code == Exit.UNREACHABLE
    assert "cannot reach the runyard service" in result.output
    assert "runyard dev up" in result.output


def test_a_spec_with_a_grid_is_submitted_as_a_sweep(service: ServiceProcess) -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "tiny-sweep.yaml"
    code, out = cli(service, "run", "submit", str(example))
    assert code == 0, out
    assert "4 runs, at most 2 at once" in out and "lr=0.001 seed=1" in out
    code, out = cli(service, "sweep", "list", "--json")
    sweep = json.loads(out)["items"][0]
    assert code == 0 and sweep["name"] == "tiny-sweep" and sum(sweep["counts"].values()) == 4
    code, out = cli(service, "sweep", "cancel", str(sweep["id"]))
    assert code == 0 and "cancelling" in out
    wait_for(
        "the sweep cancelled",
        lambda: (
            json.loads(cli(service, "sweep", "show", str(sweep["id"]), "--json")[1])["state"]
            == "CANCELLED"
        ),
        timeout_s=60,
    )
    code, out = cli(service, "sweep", "cancel", str(sweep["id"]))
    assert code == Exit.ERROR and "already ended" in out
