"""What a service without the sample sees of `eo pipeline` (issue 38): the audit's report
explains the protocol's findings in the framework's terms (artifact keys named by states,
tokens, transaction records), a domain check's findings in the check's own words, and no
help text or error names the sample's orders, invoices, payments or TPC-H."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.support.counters.registry import SPEC
from tools.pipeline.audit import FINDINGS, AuditResult
from tools.pipeline.report import markdown

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 28, tzinfo=UTC)
#: The sample's words, which a service made without it has no use for.
SAMPLE_WORDS = re.compile(r"sample|tpc-?h|\borders?\b|invoice|payment|ledger|customer",
                          re.IGNORECASE)


def test_the_report_explains_the_protocols_findings_in_the_frameworks_terms(
        tmp_path: Path) -> None:
    report = markdown(AuditResult(dict.fromkeys(FINDINGS, 1), {"front": 0}, [], {}, tmp_path,
                                  NOW))
    assert ("| missing_objects | 1 | artifact keys named by committed states with no object "
            "in the bucket | `missing_objects/` |") in report
    rows = [line for line in report.splitlines() if line.startswith("| ")][1:]
    assert all(line.split(" | ")[2] for line in rows)  # every finding has its meaning
    assert SAMPLE_WORDS.findall(report) == []


def test_a_domain_checks_findings_are_explained_in_its_own_words(tmp_path: Path) -> None:
    counts = {"parcels": 2, **dict.fromkeys(FINDINGS, 0)}
    report = markdown(AuditResult(counts, {}, [], {}, tmp_path, NOW,
                                  meanings={"parcels": "parcels shipped twice"}))
    assert "| parcels | 2 | parcels shipped twice | `parcels/` |" in report


#: `eo` as in a service made without the sample: its packages cannot be imported, and
#: `importlib.util.find_spec` finds none of them (as when copier left them out).
_WITHOUT_THE_SAMPLE = """
import json, sys
for name in ("tools.tpch", "tools.demo", "domain.sample", "service.sample"):
    sys.modules[name] = None
from typer.testing import CliRunner
from entrypoints.cli import app
out = {}
for name, args in (("eo", ["--help"]), ("pipeline", ["pipeline", "--help"]),
                   ("audit", ["pipeline", "audit", "--help"]),
                   ("input", ["pipeline", "audit", "--output", sys.argv[1], "--input",
                              sys.argv[1]])):
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    out[name] = [result.exit_code, result.output]
print(json.dumps(out))
"""


@pytest.mark.slow  # a cold interpreter: the sample's packages hidden before anything imports
def test_without_the_sample_eo_pipeline_names_none_of_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EO_")} | {
        "EO_SERVICE": SPEC}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_THE_SAMPLE, str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert {name: code for name, (code, _) in seen.items()} == {
        "eo": 0, "pipeline": 0, "audit": 0, "input": 2}
    assert "export-tpch" not in seen["pipeline"][1]
    assert "none is named: add --domain module:name" in seen["input"][1]
    pipeline = [line for line in seen["eo"][1].splitlines() if "pipeline" in line]
    for text in [*pipeline, seen["pipeline"][1], seen["audit"][1], seen["input"][1]]:
        text = text.replace(str(tmp_path), "DIR")  # the test's name is no help text
        assert SAMPLE_WORDS.findall(text) == [], text
