"""Alert rules as code: deploy/prometheus/runyard-rules.yml, checked and unit-tested by
promtool (Debian's `prometheus` package; scripts/bootstrap.sh installs it)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

RULES = REPO_ROOT / "deploy" / "prometheus" / "runyard-rules.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "runyard-rules.test.yml"


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: run scripts/bootstrap.sh (apt-get install prometheus)")
    return found


def alerts(path: Path) -> list[dict]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_the_rules_are_valid_promql() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    print(checked.stdout, checked.stderr)
    assert checked.returncode == 0


def test_every_alert_fires_and_stays_quiet_as_its_tests_say() -> None:
    tested = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True
    )
    print(tested.stdout, tested.stderr)
    assert tested.returncode == 0


def test_each_alert_has_a_firing_and_a_quiet_test() -> None:
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    for rule in alerts(RULES):
        checks = [
            check
            for case in cases
            for check in case["alert_rule_test"]
            if check["alertname"] == rule["alert"]
        ]
        assert any(c["exp_alerts"] for c in checks), f"{rule['alert']}: no firing test"
        assert any(not c["exp_alerts"] for c in checks), f"{rule['alert']}: no quiet test"


def test_the_rules_read_metrics_the_service_exports() -> None:
    """A renamed metric would leave its alert silent forever: every runyard_* name in the
    rules is written somewhere in service/ (counters get Prometheus' _total suffix,
    histograms _bucket)."""
    source = "\n".join(p.read_text() for p in (REPO_ROOT / "service").rglob("*.py"))
    for rule in alerts(RULES):
        for name in set(re.findall(r"runyard_[a-z_]+", rule["expr"])):
            base = re.sub(r"_(total|bucket)$", "", name)
            assert f'"{base}' in source, f"{rule['alert']} reads {name}, which nothing exports"


def test_the_integrations_gauges_are_read_from_postgres(database_url: str) -> None:
    """The alerts on trackers and notifications read gauges made at scrape time: the
    collector answers on the real (migrated) database instead of logging an error."""
    from service.tracking.integration_gauges import IntegrationsCollector

    names = {family.name for family in IntegrationsCollector().collect()}
    assert names == {
        "runyard_tracker_exports_failing",
        "runyard_tracker_exports_unfinished",
        "runyard_notification_deliveries_pending",
        "runyard_notification_oldest_pending_age_seconds",
    }
