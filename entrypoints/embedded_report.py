"""What a run of the embedded runtime came to, as the test API and `eo embedded` report it:
`EmbeddedReport`, the messages the endpoints sent (`Sent`), the dead letters one per message
(`DeadLetterEntry`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from application.dead_letter_copies import letter_digest
from application.envelope import BODY_SHA256_HEADER, REASON_HEADER, Envelope
from entrypoints.embedded_producer import RAW_ID_HEADER


@dataclass
class EmbeddedReport:
    """What a run came to: the input published or rejected, every delivery's settlement per
    endpoint (`processed`, `duplicate`, `retried`, `dead_lettered`, `unsettled`), the
    endpoints' states (JSON-ready, by partition), the messages the endpoints sent each other
    (`outputs`), the dead letters with reasons (one per message, `times` its copies), what is
    left at rest (`at_rest`: all zero when every message was consumed or dead-lettered: I8,
    I9), what the protocol keeps at rest on purpose (`kept`: the tokens dead letters keep
    for their replay), the blob keys, and how many crashes were injected."""

    service: str
    lines: int = 0
    published: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    settled: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    at_rest: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    blobs: list[str] = field(default_factory=list)
    crashes: int = 0

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (`eo embedded --format json`)."""
        return {"service": self.service,
                "input": {"lines": self.lines, "published": self.published,
                          "rejected": self.rejected},
                "settled": self.settled, "states": self.states, "outputs": self.outputs,
                "dead_letters": self.dead_letters, "at_rest": self.at_rest,
                "kept": self.kept, "blobs": self.blobs}


@dataclass(frozen=True)
class Sent:
    """A message an endpoint sent: its destination, message ID, type, JSON body, and its
    headers (the protocol's lineage among them: `eo-causation-id` names the message whose
    processing sent it, `eo-origin-id` the outside message its chain started from)."""

    to: str
    message_id: uuid.UUID
    type: str
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetterEntry:
    """A dead letter of `queue`: the message ID as sent, its type, the reason (the last
    copy's), and how many copies of the message were dead-lettered (`times`): one entry per
    message, as the dead-letter store keeps them (copies under one message ID with one type
    and body are one message; `application.dead_letter_copies.letter_digest`)."""

    queue: str
    message_id: str
    type: str
    reason: str
    times: int = 1


def entries_of(dead_letters: Mapping[str, Iterable[Envelope]]) -> list[DeadLetterEntry]:
    """The dead letters of each queue (the dead-letter queues' envelopes, in order) one per
    message, as the dead-letter store keeps them: copies under one message ID with one type
    and body are one entry, `times` their count, the reason the last copy's."""
    merged: dict[tuple[str, str, str], DeadLetterEntry] = {}
    for name, letters in dead_letters.items():
        for e in letters:
            message_id = e.header(RAW_ID_HEADER) or str(e.message_id)
            key = (name, message_id, letter_digest(e.type, e.body, e.header(BODY_SHA256_HEADER)))
            known = merged.get(key)
            merged[key] = DeadLetterEntry(name, message_id, e.type, e.header(REASON_HEADER) or "",
                                          known.times + 1 if known is not None else 1)
    return list(merged.values())
