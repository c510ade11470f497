"""`eo demo` end to end on the embedded profile, and the oracle's teeth."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapters.memory.broker import MemoryBroker
from entrypoints.cli import app
from entrypoints.embedded import EmbeddedContainer
from entrypoints.settings import SettingsError, resolve_service
from tools.demo.local import DEMO_BUCKET, demo_settings
from tools.demo.run import DuplicatingDispatcher, run_demo
from tools.settings import load_tool_settings
from tools.tpch.data import generate
from tools.tpch.oracle import check_oracle

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

runner = CliRunner()


async def test_demo_passes_its_oracle_and_the_oracle_catches_a_doubled_line(
    tmp_path: Path,
) -> None:
    settings = load_tool_settings(blob_dir=tmp_path)
    container = EmbeddedContainer(settings=settings, service=resolve_service(settings))
    container.broker.override(MemoryBroker(shuffle=random.Random(2)))
    rng = random.Random(2)
    duplicating = DuplicatingDispatcher(container.broker(), 0.15, rng, late_s=0.2)
    container.dispatcher.override(duplicating)
    sample = generate(0.001)
    system = container.workers()
    report = await run_demo(system, sample, duplicating, consumers=2, rng=rng,
                            credit_limit=settings.credit_limit, settings=settings)
    assert report.oracle.violations == []
    assert report.ok
    assert report.oracle.confirmed + report.oracle.rejected == 1500
    assert report.settlements["duplicate"] > 0
    assert report.duplicates_injected >= 0.10 * report.deliveries

    orders = system.stores["orders"].states()
    key, order = next((k, o) for k, o in orders.items() if len(o.lines) >= 1)
    tampered = {**orders, key: replace(order, lines=(*order.lines, order.lines[0]),
                                       total=(order.total or Decimal(0)) + 1)}
    again = check_oracle(sample, tampered, system.stores["ledger"].states(),
                         system.stores["payments"].states(), await system.blobs.keys(),
                         settings.credit_limit)
    assert any(f"order {key}" in v for v in again.violations)


def test_cli_lists_its_sub_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("demo", "failpoints", "settings"):
        assert command in result.output


def test_a_bad_setting_stops_with_its_name(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("EO_PREFETCH", "0")
    result = runner.invoke(app, ["settings"])
    assert result.exit_code == 2
    assert "EO_PREFETCH" in result.output


def test_a_bad_failpoint_spec_is_refused() -> None:
    result = runner.invoke(app, ["failpoints", "after_comit=crash"])
    assert result.exit_code == 2
    assert "after_comit" in result.output


def test_orders_on_the_outbox_strategy_are_refused_at_start_up(tmp_path: Path) -> None:
    """Orders call payments: their follow-ups' request URLs are trusted from the follow-up's
    token, and the outbox path reads no token (security review: an outside producer's
    headers are never honoured there), so `orders=outbox` is refused naming the reason;
    `ledger=outbox` runs (tests/sample/test_demo.py, the demo's own strategies)."""
    with pytest.raises(SettingsError, match="orders=outbox: it calls HTTP callees"):
        resolve_service(load_tool_settings(blob_dir=tmp_path, strategies={"orders": "outbox"}))


@pytest.mark.parametrize("command", [["demo"], ["demo", "--profile", "local"],
                                     ["chaos", "--duration", "0"]])
def test_the_sample_tools_refuse_the_production_profile(command: list[str]) -> None:
    """The security review: `eo demo --profile local` overrode EO_PROFILE=production, then
    deleted the queues on EO_AMQP_URL and every object of EO_S3_BUCKET."""
    result = runner.invoke(app, command, env={"EO_PROFILE": "production"})
    assert result.exit_code == 2, result.output
    assert "refuses the production profile" in " ".join(result.output.split())


def test_the_local_demo_uses_a_bucket_of_its_own(tmp_path: Path) -> None:
    base = load_tool_settings(profile="local", s3_bucket="acme-production-blobs")
    assert demo_settings(base, tmp_path).bucket() == DEMO_BUCKET != base.bucket()
