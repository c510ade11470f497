"""`eo chaos`'s fence scenarios on the template's fixture endpoints (parcels, tracking), in
the template's checkout: they pass on the framework as it is, and the mutation suite's
`fence-campaign-sees-*` mutations (each half of finish's fence removed) make them report the
late finisher's damage. The service made from the template runs its own campaign in
test_instantiation.py; these mutations need no copy of the template to be caught."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.services import discover
from tests.template.fixture_service import SPEC, campaign_lines

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


async def test_the_fence_scenarios_find_no_violation_on_the_fixture_service(
        tmp_path: Path) -> None:
    """`eo chaos --fence-only`: both halves of finish's fence staged on each endpoint, with
    real consumers on PostgreSQL and RabbitMQ: on parcels (the gateway: a parcel shipped,
    then insured) and on tracking (fed only by parcels: two parcels of one destination, each
    booking a pickup, a follow-up). A correct framework passes; without the attempt guard or
    the compare-and-clear, the scenario of that half finds the next message committed twice
    (I1) and this test fails."""
    messages = tmp_path / "messages.jsonl"
    messages.write_text("\n".join(campaign_lines()) + "\n")
    services = discover()
    # the user's settings left out; the mutation suite's --fail-fast kept
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EO_") or k == "EO_CHAOS_FAIL_FAST"}
    env.update({"EO_SERVICE": SPEC, "EO_DATABASE_DSN": services.postgres_dsn,
                "EO_AMQP_URL": services.amqp_url, "PYTHONPATH": str(ROOT)})
    report = tmp_path / "report.json"
    try:
        campaign = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from entrypoints.cli import main; main()", "chaos",
            "--messages", str(messages), "--seed", "1", "--fence-only", "--report",
            str(report), cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(campaign.communicate(), 600)
    finally:
        services.close()
    result = json.loads(report.read_text()) if report.exists() else {}
    assert result.get("violations") == [], (out[-4000:] + err[-4000:]).decode(errors="replace")
    assert campaign.returncode == 0
    assert [r["scenario"] for r in result["per_run"]] == [
        f"fence ({half}) on {endpoint}" for endpoint in ("parcels", "tracking")
        for half in ("attempt guard", "compare-and-clear")]
    assert result["fence_skipped"] == {}
    for scenario in result["per_run"]:
        assert scenario["commits"] == scenario["expected_commits"] > 0
        assert scenario["faults"]["process exit (crash failpoint)"] == 2
