"""Protocol events (section 9) come out as one JSON object per line with their fields."""

from __future__ import annotations

import io
import json
import uuid

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
