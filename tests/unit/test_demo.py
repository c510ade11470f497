"""`eo demo` end to end on the embedded profile, and the oracle's teeth."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

from typer.testing import CliRunner

from adapters.memory.broker import MemoryBroker
from entrypoints.cli import app
from entrypoints.container import EmbeddedContainer
from entrypoints.demo.oracle_check import check_oracle
from entrypoints.demo.run import DuplicatingDispatcher, run_demo
from entrypoints.demo.tpch import generate
from entrypoints.settings import load_settings

runner = CliRunner()


async def test_demo_passes_its_oracle_and_the_oracle_catches_a_doubled_line(
    tmp_path: Path,
) -> None:
    settings = load_settings(blob_dir=tmp_path)
    container = EmbeddedContainer(settings=settings)
    container.broker.override(MemoryBroker(shuffle=random.Random(2)))
    rng = random.Random(2)
    duplicating = DuplicatingDispatcher(container.broker(), 0.15, rng, late_s=0.2)
    container.dispatcher.override(duplicating)
    sample = generate(0.001)
    system = container.system()
    report = await run_demo(system, sample, duplicating, consumers=2, rng=rng)
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


async def test_orders_on_the_outbox_strategy_still_read_their_follow_ups_request_urls(
    tmp_path: Path,
) -> None:
    """The outbox path trusts `eo-request-url` only from the token row its sender wrote:
    orders' own payment follow-ups carry one, so orders on `outbox` still settles every
    order (a stray header from an outside producer is dropped: tests/chaos/test_bad_input)."""
    settings = load_settings(blob_dir=tmp_path, strategies={"orders": "outbox"})
    container = EmbeddedContainer(settings=settings)
    rng = random.Random(3)
    duplicating = DuplicatingDispatcher(container.broker(), 0.1, rng, late_s=0.1)
    container.dispatcher.override(duplicating)
    full = generate(0.001)
    sample = full.subset(sorted(full.expected)[:150])
    report = await run_demo(container.system(), sample, duplicating, consumers=2, rng=rng)
    assert report.oracle.violations == []
    assert report.oracle.confirmed + report.oracle.rejected == len(sample.expected)
