"""Fault injection in a process (protocol 10): failpoints from `EO_FAILPOINTS`, the `crash`
action, and duplicate dispatches (`EO_DUPLICATE_RATE`)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from application.envelope import Envelope
from application.failpoints import Failpoints
from application.observability import FAULT_INJECTED
from application.ports import EventSink, MessageDispatcher
from entrypoints.settings import Settings

#: The exit status of a process ended by a `crash` failpoint (EX_SOFTWARE of sysexits.h).
CRASH_EXIT = 70


def crash_process(name: str) -> None:
    """The `crash` failpoint action in a process: exit at once, no clean-up, no ack."""
    os.write(2, f"failpoint {name}: crash\n".encode())
    os._exit(CRASH_EXIT)


def fault_logger(events: EventSink) -> Callable[[str, str], None]:
    """The failpoints' `on_fire` hook: a `fault.injected` event (failpoint, action), emitted
    before the action runs (a `crash` exits right after the line is written)."""
    def on_fire(name: str, action: str) -> None:
        events.emit(FAULT_INJECTED, failpoint=name, action=action)
    return on_fire


def failpoints_from(settings: Settings, events: EventSink,
                    drop_conn: Callable[[], Awaitable[None]] | None = None
                    ) -> Failpoints | None:
    """Active failpoints of `EO_FAILPOINTS` (`crash` exits the process, `drop_conn` calls
    `drop_conn`, each firing logged first as `fault.injected`), or None (zero cost) when
    unset."""
    return Failpoints.from_spec(settings.faults.failpoints, crash_process, drop_conn,
                                on_fire=fault_logger(events), gates=settings.faults.failpoint_gates)


class DuplicatingDispatcher:
    """Fault injection (`EO_DUPLICATE_RATE`): publishes a share of dispatches twice in a row
    with the same message ID, so two consumers may get concurrent copies. Each copy emits
    `fault.duplicate_injected`."""

    def __init__(self, inner: MessageDispatcher, rate: float, events: EventSink) -> None:
        self.inner, self.rate, self.events = inner, rate, events
        self._count = 0

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        await self.inner.dispatch(destination, envelope)
        self._count += 1
        # deterministic spacing: every 1/rate-th dispatch is doubled
        if int(self._count * self.rate) != int((self._count - 1) * self.rate):
            await self.inner.dispatch(destination, envelope)
            self.events.emit("fault.duplicate_injected", destination=destination,
                             message_id=str(envelope.message_id))


def with_duplicates(dispatcher: MessageDispatcher, settings: Settings, events: EventSink
                    ) -> MessageDispatcher:
    """`dispatcher`, wrapped by duplicate injection when `EO_DUPLICATE_RATE` is set."""
    if not settings.faults.duplicate_rate:
        return dispatcher
    return DuplicatingDispatcher(dispatcher, settings.faults.duplicate_rate, events)
