"""The event names of protocol 9 and an in-process counter of them."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Final

MESSAGE_RECEIVED: Final = "message.received"
MESSAGE_DUPLICATE: Final = "message.duplicate"
HANDLER_INVOKED: Final = "handler.invoked"
TRANSACTION_COMMITTED: Final = "transaction.committed"
TRANSACTION_CONFLICT: Final = "transaction.conflict"
#: a batched attempt left before anything durable (its decision needs the single path, its
#: handler failed, or its round's statement failed): the message is processed again alone
#: (`reason`); the end of that attempt, as a conflict ends one. Also a callee's attempt at a
#: request that failed transiently: answered 503, the caller retries (`message_id`: the
#: request's ID)
ATTEMPT_ABANDONED: Final = "attempt.abandoned"
SIDE_EFFECT_PUBLISHED: Final = "side_effect.published"
SIDE_EFFECT_CLEANED: Final = "side_effect.cleaned"
TOKEN_CONSUMED: Final = "token.consumed"
MESSAGE_DEAD_LETTERED: Final = "message.dead_lettered"
MESSAGE_RETRIED: Final = "message.retried"
SETTLEMENT_FAILED: Final = "message.settlement_failed"
#: the dead-letter queue refused a dead letter (full): the endpoint takes no new delivery
#: until it has room (`reason`), then `dead_letter_queue.room`. Logged at ERROR.
DEAD_LETTER_QUEUE_FULL: Final = "dead_letter_queue.full"
DEAD_LETTER_QUEUE_ROOM: Final = "dead_letter_queue.room"
#: the dead-letter store (application/dead_letters.py): a dead letter moved there from its
#: queue; an operator (`by`) republished one, or discarded one (`why`, `released`)
DEAD_LETTER_STORED: Final = "dead_letter.stored"
DEAD_LETTER_REPLAYED: Final = "dead_letter.replayed"
DEAD_LETTER_DISCARDED: Final = "dead_letter.discarded"
#: a dead letter its queue's collector could not read or the store refused as it came
#: (`error`): kept in its plainest form (every text escaped, `dead_letter_id`), so the rest
#: of the queue is collected behind it. Logged at ERROR.
DEAD_LETTER_UNSTORABLE: Final = "dead_letter.unstorable"
#: fault injection (protocol 10): a failpoint fired (`failpoint`, `action`)
FAULT_INJECTED: Final = "fault.injected"
#: the inbox relay (application/inbox_relay.py): one per row published and marked relayed,
#: one per relay round that failed
INBOX_RELAYED: Final = "inbox.relayed"
INBOX_RELAY_FAILED: Final = "inbox.relay_failed"
#: an inbox row that cannot be relayed (`reason`), dead-lettered and marked: logged at ERROR
INBOX_DEAD_LETTERED: Final = "inbox.dead_lettered"
#: consumption supervised (adapters/rabbitmq/consumer.py): the work queue's consumer is gone
#: (`reason`: channel_closed, cancelled, no_consumer, stalled), then re-created (`after_s`)
CONSUMER_LOST: Final = "consumer.lost"
CONSUMER_RESTARTED: Final = "consumer.restarted"
#: a third-party API answered a follow-up's request (protocol 12): its status, the try
API_CALLED: Final = "api.called"

EVENTS: Final = (
    MESSAGE_RECEIVED, MESSAGE_DUPLICATE, HANDLER_INVOKED, TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT, ATTEMPT_ABANDONED, SIDE_EFFECT_PUBLISHED, SIDE_EFFECT_CLEANED,
    TOKEN_CONSUMED,
    MESSAGE_DEAD_LETTERED, MESSAGE_RETRIED, SETTLEMENT_FAILED, DEAD_LETTER_QUEUE_FULL,
    DEAD_LETTER_QUEUE_ROOM, DEAD_LETTER_STORED, DEAD_LETTER_REPLAYED, DEAD_LETTER_DISCARDED,
    DEAD_LETTER_UNSTORABLE, INBOX_RELAYED,
    INBOX_RELAY_FAILED, INBOX_DEAD_LETTERED, CONSUMER_LOST, CONSUMER_RESTARTED, API_CALLED,
)


def attempt_fields(endpoint: str, message_id: uuid.UUID | str, attempt_id: uuid.UUID,
                   partition: str) -> dict[str, str]:
    """The fields that name an attempt in its events (`handler.invoked`,
    `transaction.committed`, `side_effect.*`, `token.consumed`): endpoint, message ID (a
    UUID, or its text when formatted already: `Envelope.id_text`), attempt ID and partition,
    as text. Built once per attempt and handed along, as the UUIDs' text costs a formatting
    each time."""
    return {"endpoint": endpoint, "message_id": str(message_id),
            "attempt_id": str(attempt_id), "partition": partition}


class CountingSink:
    """An `EventSink` that counts events per (endpoint, event) and forwards to `inner`."""

    def __init__(self, inner: object | None = None) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self._inner = inner

    def emit(self, event: str, **fields: object) -> None:
        """Count `event` under its `endpoint` field, then forward it."""
        self.counts[(str(fields.get("endpoint", "")), event)] += 1
        emit = getattr(self._inner, "emit", None)
        if emit is not None:
            emit(event, **fields)

    def total(self, event: str) -> int:
        """How often `event` was emitted, over all endpoints."""
        return sum(n for (_, name), n in self.counts.items() if name == event)


def message_attributes(endpoint: str, message_id: str) -> dict[str, str]:
    """The span attributes of a message processed at `endpoint` (OpenTelemetry's messaging
    semantic conventions: the endpoint is the destination its work queue is named after)."""
    return {"messaging.destination.name": endpoint, "messaging.message.id": message_id,
            "messaging.operation.type": "process"}
