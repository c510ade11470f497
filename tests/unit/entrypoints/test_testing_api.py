"""The public test API (entrypoints/testing.py) on the counters service: messages sent as
domain objects or raw bodies, states read as domain objects, and the same final states under
every fault it injects (copies, redeliveries, out-of-order deliveries, several consumers,
crashes that kill the whole service mid-way) as without them, with nothing left at rest."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from entrypoints.testing import EmbeddedService, Faults
from tests.support.counters.endpoints import Account, Add, AuditLog, Spend
from tests.support.counters.registry import REGISTRY

NOTHING_AT_REST = {"tokens in flight": 0, "unfinished transaction records": 0,
                   "side-effect records": 0, "deferred clean-ups": 0, "requests on callees": 0,
                   "unrelayed inbox rows": 0}
#: Crashes of the whole service at several steps of the token path and the gateway's.
CRASHES = ("after_commit=crash@3;after_create:blob=crash@4;before_ack=crash@6;"
           "after_consume_token=crash@8;after_publish_all=crash@10;after_tr_clear=crash@12")


async def test_send_run_and_read_the_states_as_domain_objects() -> None:
    async with EmbeddedService.start(REGISTRY) as service:
        first = await service.send("front", Add("c1", 2))
        await service.send("front", Add("c1", 2), message_id=first)  # a producer's retry
        await service.send("front", {"counter": "c1", "amount": 3}, type_name="Add")
        await service.send("front", b"{not json", type_name="Add")  # dead-lettered
        report = await service.run_until_quiet()
        counter = service.states("counter")["c1"]
        assert counter.total == 5  # each message once, the retried copy dropped
        # the gateway re-publishes its stored output for the retry: one message, two copies
        sent = service.outputs(to="counter")
        assert (len(sent), len({s.message_id for s in sent})) == (3, 2)
        [letter] = service.dead_letters("front")
        assert letter.type == "Add"
        assert "JSON" in letter.reason
    assert report.settled["front"]["duplicate"] == 1
    assert report.at_rest == NOTHING_AT_REST
    assert len(report.blobs) == 2  # one receipt per applied Add


async def test_a_rejection_keeps_its_token_apart_and_copies_are_one_dead_letter() -> None:
    """The documented idiom `not any(report.at_rest.values())` holds on a run with a
    handler's rejection: the token its dead letter keeps for a replay is counted apart
    (`report.kept`, as `eo inspect` does). A malformed message published twice under one
    message ID is one dead letter, seen twice (as the dead-letter store keeps it)."""
    async with EmbeddedService.start(REGISTRY) as service:
        await service.send("front", Add("c1", -5))  # counter rejects it: dead-lettered
        twice = uuid.uuid4()
        for _ in range(2):
            await service.send("front", b"{still not json", type_name="Add", message_id=twice)
        report = await service.run_until_quiet()
        rejected = service.dead_letters("counter")
        [malformed] = service.dead_letters("front")
    assert [d.reason for d in rejected] == ["rejected by handler: negative amount -5"]
    assert (malformed.message_id, malformed.times) == (str(twice), 2)
    assert report.at_rest == NOTHING_AT_REST
    assert not any(report.at_rest.values())
    assert report.kept == {"tokens kept by dead letters": 1}
    assert [d["times"] for d in report.dead_letters["front"]] == [2]


async def test_a_message_a_queue_does_not_take_is_refused_by_name() -> None:
    async with EmbeddedService.start(REGISTRY) as service:
        with pytest.raises(KeyError, match="no queue 'nowhere'"):
            await service.send("nowhere", Add("c1", 1))
        with pytest.raises(ValueError, match="audit does not take Add"):
            await service.send("audit", Add("c1", 1))


@pytest.mark.parametrize(("field", "value"), [
    ("duplicates", 1.0), ("redeliveries", -0.1), ("workers", 0), ("failpoints", "nope=crash")])
def test_bad_faults_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field if field != "failpoints" else "nope"):
        Faults(**{field: value})


def _workload(seed: int) -> list[tuple[str, Add]]:
    """40 Adds to the gateway for 5 counters, a quarter of them sent twice (one ID)."""
    rng = random.Random(seed)
    sends = []
    for _ in range(40):
        message_id = str(uuid.UUID(int=rng.getrandbits(128)))
        add = Add(f"c{rng.randrange(5)}", rng.randrange(1, 100))
        sends.append((message_id, add))
        if rng.random() < 0.25:
            sends.append((message_id, add))
    return sends


async def _run(faults: Faults) -> tuple[dict[str, Any], int, int]:
    """The counters' totals and applied counts, the blob count and the crashes of a run."""
    async with EmbeddedService.start(REGISTRY, faults=faults, retry_delays_s=[0.01]) as service:
        for message_id, add in _workload(7):
            await service.send("front", add, message_id=message_id)
        report = await service.run_until_quiet(timeout_s=30)
        assert report.at_rest == NOTHING_AT_REST, faults
        assert report.dead_letters == {}, faults
        # the gateway gives each relayed message an ID of its own: compare how many
        totals = {key: (state.total, len(state.applied))
                  for key, state in service.states("counter").items()}
    return totals, len(report.blobs), report.crashes


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_every_fault_leaves_the_fault_free_states(seed: int) -> None:
    expected, blobs, _ = await _run(Faults())
    faults = Faults(seed=seed, duplicates=0.2, redeliveries=0.2, out_of_order=True, workers=2,
                    failpoints=CRASHES)
    found, found_blobs, crashes = await _run(faults)
    assert found == expected
    assert found_blobs == blobs  # no receipt orphaned, none missing
    assert crashes == 6  # every crash fired, and the service came back after each


async def test_faults_are_drawn_once_per_message_so_a_heavy_dose_still_ends() -> None:
    """Copies and channel losses at nine deliveries in ten: drawn on every delivery, each
    loss would redeliver a whole prefetch, each redelivery draw again, and the run would
    never go quiet (thousands of copies ready, `run_until_quiet` times out); drawn on a
    message's first delivery to a queue, each message makes at most one copy and one loss
    there, and the run ends."""
    faults = Faults(seed=4, duplicates=0.9, redeliveries=0.9, workers=2)
    async with EmbeddedService.start(REGISTRY, faults=faults) as service:
        for n in range(60):
            await service.send("front", Add(f"c{n % 5}", 1))
        report = await service.run_until_quiet(timeout_s=30)
        assert report.at_rest == NOTHING_AT_REST
        assert sum(s.total for s in service.states("counter").values()) == 60
    for queue in ("front", "counter"):
        assert report.settled[queue]["processed"] == 60


async def test_seeded_states_are_there_before_the_messages() -> None:
    async with EmbeddedService.start(REGISTRY) as service:
        service.seed_states("bank", {"c1": Account(balance=10)})
        await service.send("front", Spend("c1", 4))
        await service.send("front", Spend("c2", 4))  # no account: refused by the bank
        await service.run_until_quiet()
        assert service.states("bank")["c1"] == Account(balance=6, debits=(4,))
        assert service.states("counter")["c1"].spent == (4,)
        assert service.states("counter")["c2"].refused == (4,)
        assert service.api_executions() == {}  # the counters call no third-party API
    async with EmbeddedService.start(REGISTRY, strategies={"audit": "state"}) as service:
        with pytest.raises(ValueError, match="audit keeps its states in a stream"):
            service.seed_states("audit", {"c1": AuditLog()})
