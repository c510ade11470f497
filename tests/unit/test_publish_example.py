"""`docs/examples/publish.py`, the outside producer of the docs (issue 38): a message ID that
is not a UUID, which the gateway would dead-letter unprocessed, is refused before anything
connects, naming the way out (`--key`); a UUID or a business key publishes a UUID."""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "publish.py"


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, list[dict[str, Any]]]:
    """The example as a module, its `publish` recording what it would send (no broker)."""
    spec = importlib.util.spec_from_file_location("publish_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sent: list[dict[str, Any]] = []

    async def publish(url: str, queue: str, type_: str, body: dict[str, Any],
                      message_id: str, inbound: bool = False) -> None:
        sent.append({"queue": queue, "type": type_, "message_id": message_id})

    monkeypatch.setattr(module, "publish", publish)
    return module, sent


ARGS = ["amqp://guest:guest@127.0.0.1:5672/", "parcels", "Ship", '{"parcel": "p-1"}']


def test_a_message_id_that_is_not_a_uuid_is_refused_before_connecting(
        example: tuple[ModuleType, list[dict[str, Any]]],
        capsys: pytest.CaptureFixture[str]) -> None:
    module, sent = example
    with pytest.raises(SystemExit) as exited:
        module.main([*ARGS, "order-1"])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "message ID 'order-1' is not a UUID: the gateway would dead-letter it" in error
    assert "--key" in error
    assert sent == []


def test_a_uuid_or_a_business_key_publishes_a_uuid(
        example: tuple[ModuleType, list[dict[str, Any]]]) -> None:
    module, sent = example
    given = "6F1C2A4E-0000-4000-8000-000000000001"
    module.main([*ARGS, given])
    module.main([*ARGS, "--key", "p-1"])
    module.main([*ARGS, "--key", "p-1"])
    assert sent[0]["message_id"] == given.lower()
    assert uuid.UUID(sent[1]["message_id"]).version == 5
    assert sent[1] == sent[2]   # a re-run sends the same message: the gateway drops the copy
