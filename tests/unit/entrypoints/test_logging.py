"""Protocol events (section 9) come out as one JSON object per line with their fields."""

from __future__ import annotations

import io
import json
import logging
import sys
import uuid

import pytest
import structlog

from entrypoints.logs import StructlogEventSink, configure_logging
from tests.support.counter import COUNTER, Add
from tests.support.world import World


async def test_processing_a_message_logs_the_protocol_events_as_json_lines() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    world = World(COUNTER)
    world.events._inner = StructlogEventSink()
    envelope = await world.send(Add("p", 1), uuid.UUID(int=5))
    await world.processor().process(envelope)
    await world.processor().process(envelope)  # a duplicate
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    events = [line["event"] for line in lines]
    assert events[:3] == ["message.received", "handler.invoked", "transaction.committed"]
    assert {"side_effect.published", "token.consumed", "message.duplicate"} <= set(events)
    committed = next(line for line in lines if line["event"] == "transaction.committed")
    assert committed["endpoint"] == "counter"
    assert committed["message_id"] == str(envelope.message_id)
    assert committed["partition"] == "p"
    assert uuid.UUID(committed["attempt_id"])
    assert all("timestamp" in line and "level" in line for line in lines)


def test_the_standard_librarys_records_come_out_as_the_same_json_lines() -> None:
    """A lost connection is logged by the adapters through `logging`: an operator's log
    pipeline gets it as JSON with its time and level, like the protocol's events."""
    stream = io.StringIO()
    configure_logging("INFO", stream)
    # a logger of its own: the suite's other tests may have quietened the adapters' (the
    # chaos command run in-process sets adapters.rabbitmq to ERROR)
    logger = logging.getLogger(f"tests.json_lines.{uuid.uuid4().hex}")
    logger.warning("recovered the connection to %s after %.1f s", "amqp://h/", 1.25)
    logger.debug("below the level")
    [line] = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["event"] == "recovered the connection to amqp://h/ after 1.2 s"
    assert line["level"] == "warning"
    assert line["logger"] == logger.name
    assert "timestamp" in line


def test_lines_go_to_the_stderr_of_the_moment_not_one_closed_since(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Configured while stderr was a runner's capture that is closed since (a CLI run
    in-process), logging must neither fail (ValueError on a closed file: a callee answered
    500) nor lose the line: it goes to the stderr in place."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("INFO")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    structlog.get_logger().warning("after.the.swap")
    logging.getLogger(f"tests.swap.{uuid.uuid4().hex}").warning("a record after the swap")
    events = [json.loads(line)["event"] for line in second.getvalue().splitlines()]
    assert events == ["after.the.swap", "a record after the swap"]
