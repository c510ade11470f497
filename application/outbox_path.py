"""The outbox path (protocol 4): positive-proof deduplication by processed-message rows, the
outgoing messages stored in them and re-published byte-identical to a duplicate."""

from __future__ import annotations

from application.envelope import Envelope
from application.errors import Duplicate, MessageIdReused
from application.ports import Clock, MessageDispatcher, ProcessedMessages
from application.preparation import Prepared
from application.records import ProcessedMessage
from application.side_effects import from_message_payload
from application.transactional_path import Steps


class OutboxPath:
    """The outbox strategy on the shared steps, for endpoints whose senders create no tokens
    (the boundary): the commit writes a processed-message row with the outgoing messages; a
    copy of a processed message re-publishes them and is dropped. It never reads or consumes
    a token and honours no protocol (`eo-*`) header of a delivery: they come from outside
    producers (project amendment to protocol 4; an endpoint that calls HTTP callees, whose
    follow-ups need a claim check, cannot use this strategy). Construct through
    `application.assembly.build_processor`.

    `attempt` returns when the message was processed now and raises `Duplicate`,
    `MessageIdReused`, `Conflict` (the processor retries), `PermanentError` or
    `TransientError`.
    """

    def __init__(self, steps: Steps, processed: ProcessedMessages,
                 dispatcher: MessageDispatcher, clock: Clock) -> None:
        self.steps, self.processed, self.dispatcher, self.clock = (steps, processed,
                                                                   dispatcher, clock)

    async def attempt(self, envelope: Envelope) -> None:
        """One attempt at `envelope`: settle the partition, check for a processed-message
        row after the TR load, run the steps with the row the commit writes."""
        steps, stored = self.steps, envelope.from_outside()
        message = steps.runner.decode(stored)
        partition = steps.runner.partition_of(message)
        async with steps.locks.hold(partition):
            loaded = await steps.settle_committed(partition, stored.message_id)
            await self.still_pending(stored)
            await steps.hit("after_processed_check")
            await steps.run(stored, message, partition, loaded, self.processed_row)

    async def still_pending(self, stored: Envelope) -> None:
        """No processed-message row yet for the delivery's producer and message ID; a row
        means processed before: re-publish its stored, byte-identical copies (protocol 4),
        then `Duplicate`. A row whose digest (type and body) differs from this delivery's
        raises `MessageIdReused`: not a copy of that message but another one under its ID
        (project amendment to protocol 4)."""
        row = await self.processed.processed(stored.message_id, stored.producer)
        if row is not None:
            if not stored.same_message(row.digest, row.body_sha256):
                raise MessageIdReused(stored.message_id)
            for out in row.outgoing:
                destination, env = from_message_payload(out["message_id"], out)
                await self.dispatcher.dispatch(destination, env)
            raise Duplicate

    def processed_row(self, stored: Envelope, partition: str,
                      prepared: Prepared) -> ProcessedMessage:
        """The processed-message row the commit writes: the positive proof, with the
        outgoing messages a duplicate re-publishes."""
        return ProcessedMessage(stored.message_id, partition, prepared.outgoing,
                                self.clock.now(), stored.body_sha256, stored.digest,
                                stored.producer)
