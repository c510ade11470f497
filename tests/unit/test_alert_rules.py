"""The alert rules and the dashboard (deploy/prometheus, deploy/grafana; issue 26): `promtool
check rules` accepts the rules, `promtool test rules` runs each alert's unit test (firing on
its series, silent below its threshold or its `for`), a rule made wrong fails those tests,
and every series the rules and the dashboard read is one the service exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from entrypoints.status import Metrics

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "eo-alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "eo-alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "eo-dashboard.json"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool checks the rules (Debian: apt-get install prometheus; ./dev test "
           "installs it as root)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, check=False)


def exported() -> set[str]:
    """The series names the service's /metrics has (a counter `x` as `x_total`)."""
    names = set()
    for family in Metrics().registry.collect():
        names |= {sample.name for sample in family.samples}
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def read(expr: str) -> set[str]:
    """The `eo_*` series an expression reads."""
    return set(re.findall(r"\beo_[a-z_]+", expr))


@needs_promtool
def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr


@needs_promtool
def test_a_wrong_threshold_fails_the_rules_unit_tests(tmp_path: Path) -> None:
    """The unit tests have teeth: retries alert above 3 per second, not 1, and the test that
    expects orders' 2 per second to fire fails."""
    text = RULES.read_text()
    wrong = text.replace('[5m])) > 1\n', '[5m])) > 3\n')
    assert wrong != text
    (tmp_path / RULES.name).write_text(wrong)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert tested.returncode != 0
    assert "EoRetriesHigh" in tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_and_reads_exported_series() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    assert {r["alert"] for r in rules} == tested
    names = exported()
    for rule in rules:
        assert read(rule["expr"]), rule["alert"]
        assert read(rule["expr"]) <= names, (rule["alert"], read(rule["expr"]) - names)


def test_the_dashboard_reads_exported_series_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    names = exported()
    used = set().union(*map(read, exprs))
    assert used <= names, used - names
    # each alert's series is on the dashboard, so a firing alert has a panel to look at
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert set().union(*(read(r["expr"]) for r in rules)) <= used
