"""The boundary fuzzed by a hostile producer on the real broker and PostgreSQL (issue 37):
hypothesis draws random bytes for the type, the message ID, header names and values, the
content type and the body of deliveries to the counters service's gateway, legitimate
commands among them (tests/support/hostile.py says what is sent and what must hold).

`EO_TEST_HOSTILE_DELIVERIES` and `EO_TEST_HOSTILE_COMMANDS` size the campaign (a longer one
on the sample: `python -m tests.support.hostile`), `EO_TEST_HOSTILE_SEED` draws another.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hostile import SEED, TARGETS, run
from tests.support.processes import Where, where_for

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DELIVERIES = int(os.environ.get("EO_TEST_HOSTILE_DELIVERIES", "200"))
COMMANDS = int(os.environ.get("EO_TEST_HOSTILE_COMMANDS", "40"))


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_hostile_producer", "eo-hostile-producer") as found:
        yield found


async def test_no_byte_a_producer_sends_stalls_the_boundary_or_costs_a_message(
    where: Where, tmp_path: Path,
) -> None:
    """Every legitimate command is processed once, every hostile message is one entry of
    the dead-letter store with a reason per copy, no consumer is lost, the queues drain."""
    report = await run(TARGETS["counters"](), where, tmp_path, DELIVERIES, COMMANDS,
                       timeout_s=60 + DELIVERIES / 10)
    print(f"\nhostile producer, seed {SEED}: {report.text()}")
    assert report.hostile == DELIVERIES
    assert report.commands == COMMANDS
    assert report.lost == 0
