"""Hypothesis stateful test on the sample domain: random deliveries, duplicates, crashes at
random failpoints and redeliveries, one delivery at a time; at quiescence the oracle holds
(each order's outcome once: I1, and its invoice blob matches its state: I3), nothing
committed is left unfinished (I5), nothing is left at rest: tokens, side-effect records,
deferred clean-ups, callee requests (I8, I9), and every message was consumed without a dead
letter (I10). The log-level invariants (I2, I4, I6, I7) and concurrent deliveries are the
framework's tests' part: tests/unit/application/test_stateful_interleaved.py and
test_interleavings.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from adapters.system.clock import ManualClock, SeededIds
from application.assembly import build_processor
from application.codec import encode
from application.envelope import Envelope
from application.errors import Crash, PermanentError, TransientError
from application.failpoints import Failpoints
from application.observability import CountingSink
from application.processor import Processor
from domain.sample.payments import open_account
from tests.sample.support.system import sample_system
from tools.settings import ToolSettings
from tools.tpch.data import TpchSample, generate
from tools.tpch.oracle import check_oracle

CRASH_POINTS = [
    "after_token_load", "after_tr_load", "after_token_check", "after_processed_check",
    "after_handler",
    "after_register:blob", "after_register:message", "after_register:http_request",
    "after_create:blob", "after_create:message", "after_create:http_request", "before_commit",
    "after_commit", "after_publish:1", "after_publish:2", "after_publish_all",
    "after_cleanup_aborted", "after_consume_token", "after_tr_clear", "after_put", "after_api_call",
    "after_post", "before_delete", "after_delete",
]


def _small_sample(orders: int = 3) -> TpchSample:
    full = generate(0.001)
    removed = {getattr(c.message, "order_key", None) for c in full.commands
               if type(c.message).__name__ == "RemoveItem"}
    small = sorted(k for k, e in full.expected.items() if 1 <= len(e.lines) <= 2)
    keys = [next(k for k in small if k in removed), *[k for k in small if k not in removed][
        : orders - 1]]
    customers = {full.order_customers[k] for k in keys}
    return TpchSample(
        commands=tuple(c for c in full.commands if getattr(c.message, "order_key", None) in keys),
        customers=tuple((c, b) for c, b in full.customers if c in customers),
        expected={k: full.expected[k] for k in keys},
        order_customers={k: full.order_customers[k] for k in keys},
    )


SAMPLE = _small_sample()


@dataclass
class Bag:
    """The broker as a bag: every dispatch lands here; the test decides what is delivered."""

    pending: list[tuple[str, Envelope]] = field(default_factory=list)

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        self.pending.append((destination, envelope))


def _crash(name: str) -> None:
    raise Crash(name)


class SampleMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.bag = Bag()
        self.settings = ToolSettings(credit_limit=50_000)  # type: ignore[arg-type]
        self.system = sample_system(self.settings, self.clock, SeededIds(3), CountingSink(),
                                    self.bag)
        for customer, balance in SAMPLE.customers:
            self.system.stores["payments"].seed_state(
                str(customer), open_account(customer, balance, self.settings.credit_limit))
        for command in SAMPLE.commands:
            self.bag.pending.append(("gateway", Envelope(
                command.message_id, type(command.message).__name__, encode(command.message),
                MappingProxyType({}))))
        self.dead_letters: list[str] = []

    def _processor(self, name: str, spec: str | None = None) -> Processor:
        return build_processor(self.system.registry[name].endpoint, self.system.ports(name),
                               self.system.strategy(name),
                               Failpoints.from_spec(spec, _crash))

    def _settle(self, index: int, spec: str | None = None) -> None:
        destination, envelope = self.bag.pending.pop(index % len(self.bag.pending))
        try:
            self.loop.run_until_complete(self._processor(destination, spec).process(envelope))
        except (Crash, TransientError) as exc:
            event(f"{type(exc).__name__} in {destination}")
            self.bag.pending.append((destination, envelope))  # unacked: redelivered
        except PermanentError as exc:
            self.dead_letters.append(f"{destination} {envelope.type}: {exc.reason}")

    @precondition(lambda self: self.bag.pending)
    @rule(index=st.integers(0, 10_000))
    def deliver(self, index: int) -> None:
        self._settle(index)

    @precondition(lambda self: self.bag.pending)
    @rule(index=st.integers(0, 10_000))
    def duplicate(self, index: int) -> None:
        self.bag.pending.append(self.bag.pending[index % len(self.bag.pending)])

    @precondition(lambda self: self.bag.pending)
    @rule(index=st.integers(0, 10_000), point=st.sampled_from(CRASH_POINTS),
          hit=st.integers(1, 2))
    def crash(self, index: int, point: str, hit: int) -> None:
        self._settle(index, f"{point}=crash@{hit}")

    @rule()
    def sweep(self) -> None:
        self.clock.advance(timedelta(seconds=31))
        for name in self.system.registry.names():
            self.loop.run_until_complete(self.system.sweeper(name).sweep())

    def teardown(self) -> None:
        try:
            self._quiesce_and_check()
        finally:
            self.loop.close()

    def _quiesce_and_check(self) -> None:
        steps = 0
        while self.bag.pending:  # I10: bounded faults, then everything is consumed
            self._settle(0)
            steps += 1
            assert steps < 10_000, "no quiescence"
        self.clock.advance(timedelta(hours=2))
        for name in self.system.registry.names():
            self.loop.run_until_complete(self.system.sweeper(name).sweep())
        assert self.dead_letters == []
        stores = self.system.stores
        result = check_oracle(SAMPLE, stores["orders"].states(), stores["ledger"].states(),
                              stores["payments"].states(),
                              sorted(self.system.blobs.objects),  # type: ignore[attr-defined]
                              self.settings.credit_limit)
        assert result.violations == []
        assert self.system.tokens.rows == {}  # I8, I9
        assert all(not p.tr.is_committed for s in stores.values() for p in s.partitions.values())
        assert sum(s.record_count() for s in stores.values()) == 0
        assert all(not s.cleanups for s in stores.values())
        payments = self.system.requests["payments"]
        assert payments.requests == {}  # type: ignore[attr-defined]  # no request left


SampleMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=120, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestSampleStateful = SampleMachine.TestCase


def test_sample_is_small_but_exercises_removals() -> None:
    kinds = {type(c.message).__name__ for c in SAMPLE.commands}
    assert len(SAMPLE.expected) == 3
    assert {"PlaceOrder", "AddItem", "RemoveItem", "SubmitOrder"} <= kinds


def test_the_machine_detects_a_lost_command() -> None:
    """The final check is not vacuous: losing one AddItem makes it fail."""
    machine = SampleMachine()
    lost = next(i for i, (_, e) in enumerate(machine.bag.pending) if e.type == "AddItem")
    machine.bag.pending.pop(lost)
    try:
        machine._quiesce_and_check()
    except AssertionError:
        return
    finally:
        machine.loop.close()
    raise AssertionError("a lost AddItem went unnoticed")
