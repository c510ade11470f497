"""The registry (application/registry.py): each rule a declaration must keep, refused with
a message naming the endpoint; the queues each endpoint declares; strategies over the
defaults. On the counters service and small registries made for one rule each."""

from __future__ import annotations

from dataclasses import replace

import pytest

from application.registry import Registration, Registry, RegistryError, Role
from application.strategy import Strategy
from tests.support.counters.endpoints import AUDIT, BANK, COUNTER, FRONT, Spend, Withdraw
from tests.support.counters.registry import REGISTRY
from tests.support.set_algebra import SET_ALGEBRA


def _refused(*registrations: Registration) -> str:
    """The message of the `RegistryError` the declaration raises."""
    with pytest.raises(RegistryError, match=r"^the registry cannot run: ") as caught:
        Registry("test", registrations)
    return str(caught.value)


def test_the_counters_registry_runs_and_describes_its_endpoints() -> None:
    assert REGISTRY.errors() == []
    assert REGISTRY.names() == ["front", "counter", "audit", "bank"]
    assert REGISTRY.names(Role.CALLEE) == ["bank"]
    assert REGISTRY.names(Role.GATEWAY, Role.CALLEE) == ["front", "bank"]
    assert REGISTRY.consuming() == ["front", "counter", "audit"]
    assert "bank" in REGISTRY
    assert "nope" not in REGISTRY
    assert REGISTRY["counter"].endpoint is COUNTER
    assert [r.name for r in REGISTRY] == REGISTRY.names()
    assert REGISTRY["bank"].stored_request == "Withdraw"
    assert [r.default_strategy for r in REGISTRY] == [
        Strategy.OUTBOX, Strategy.TOKEN, Strategy.TOKEN, Strategy.TOKEN]
    assert [r.uses_artifacts for r in REGISTRY] == [False, True, False, True]


def test_an_unknown_endpoint_is_a_key_error_listing_the_endpoints() -> None:
    with pytest.raises(KeyError, match=r"no endpoint 'nope'; the service has \['front', "
                                       r"'counter', 'audit', 'bank'\]"):
        REGISTRY["nope"]


def test_queues_of_are_its_own_work_queue_and_its_outputs() -> None:
    assert REGISTRY.queues_of("front") == ["front", "counter"]
    assert REGISTRY.queues_of("counter") == ["counter", "audit"]
    assert REGISTRY.queues_of("audit") == ["audit"]
    assert REGISTRY.queues_of("bank") == []  # a callee has no work queue
    sets = Registry("sets", (Registration(replace(SET_ALGEBRA, outputs=("audit", "audit"))),
                             Registration(AUDIT)))
    assert sets.queues_of("sets") == ["sets", "audit"]  # once each
    with pytest.raises(KeyError, match="no endpoint 'nope'"):
        REGISTRY.queues_of("nope")


@pytest.mark.parametrize("name", ["Counter", "2counters", "a counter", "counter.dlq", "x" * 64])
def test_an_endpoint_name_must_be_usable_as_queue_table_key_and_variable(name: str) -> None:
    message = _refused(Registration(replace(AUDIT, name=name)))
    assert f"{name!r}: an endpoint name is lower case letters, digits" in message


def test_an_endpoint_declared_twice_is_refused() -> None:
    assert "audit: declared twice" in _refused(Registration(AUDIT), Registration(AUDIT))


def test_blob_prefixes_name_an_endpoints_blobs_as_artifact_key_prefixes() -> None:
    assert "audit: blob_prefixes name the blobs of an endpoint with blobs=True" in _refused(
        Registration(AUDIT, blob_prefixes=("receipts",)))
    for bad in ("/receipts", "receipts/", "a//b", "re ceipts"):
        message = _refused(Registration(AUDIT, blobs=True, blob_prefixes=(bad,)))
        assert f"audit: blob prefix {bad!r} is not a key prefix" in message
    # fields may name another endpoint's blobs: no blobs=True needed
    Registry("test", (Registration(AUDIT, blob_fields=("receipt",)),
                      Registration(replace(AUDIT, name="store"), blobs=True,
                                   blob_prefixes=("receipts", "exports/2026"))))


def test_outputs_must_go_to_registered_endpoints_with_a_work_queue() -> None:
    assert "sets sends to audit, which is not registered" in _refused(Registration(SET_ALGEBRA))
    to_callee = replace(SET_ALGEBRA, outputs=("bank",))
    message = _refused(Registration(to_callee), Registration(BANK, role=Role.CALLEE))
    assert "sets sends to bank, an HTTP callee (call it with CallHttp instead)" in message


@pytest.mark.parametrize("callee", ["vault", "audit"])
def test_callees_called_must_be_registered_callees(callee: str) -> None:
    message = _refused(Registration(COUNTER, blobs=True, callees=(callee,)), Registration(AUDIT))
    assert f"counter calls {callee}, which is not a registered callee" in message


@pytest.mark.parametrize("strategy", [Strategy.TOKEN, Strategy.STATE])
def test_a_gateway_uses_outbox(strategy: Strategy) -> None:
    message = _refused(Registration(FRONT, role=Role.GATEWAY, strategy=strategy),
                       Registration(COUNTER, blobs=True, callees=("bank",)),
                       Registration(AUDIT), Registration(BANK, role=Role.CALLEE))
    assert "front: a gateway uses 'outbox' (outside producers create no tokens)" in message


@pytest.mark.parametrize("strategy", [Strategy.OUTBOX, Strategy.STATE])
def test_a_callee_uses_token(strategy: Strategy) -> None:
    message = _refused(Registration(BANK, role=Role.CALLEE, strategy=strategy))
    assert "bank: a callee uses 'token' (its stored requests are its tokens)" in message


def test_a_callee_names_its_stored_request_type() -> None:
    several = replace(BANK, messages={"Withdraw": Withdraw, "Spend": Spend})
    message = _refused(Registration(several, role=Role.CALLEE))
    assert "bank: a callee with several message types needs request_type" in message
    chosen = Registry("test", (Registration(several, role=Role.CALLEE, request_type="Spend"),))
    assert chosen["bank"].stored_request == "Spend"
    message = _refused(Registration(BANK, role=Role.CALLEE, request_type="Deposit"))
    assert "bank: request_type 'Deposit' is not one of its message types" in message


@pytest.mark.parametrize(
    "registration",
    [
        Registration(AUDIT, strategy=Strategy.STATE, blobs=True),
        Registration(AUDIT, strategy=Strategy.STATE, callees=("bank",)),
    ],
)
def test_state_is_refused_for_an_endpoint_with_artifacts(registration: Registration) -> None:
    message = _refused(registration, Registration(BANK, role=Role.CALLEE))
    assert "audit=state: it creates blobs, calls HTTP callees or stores replies" in message


def test_state_is_refused_for_an_endpoint_sending_to_a_token_receiver() -> None:
    message = _refused(Registration(SET_ALGEBRA, strategy=Strategy.STATE), Registration(AUDIT))
    assert ("sets=state sends to audit, which uses 'token': a state endpoint's outputs carry "
            "no token, so every receiver must use 'outbox' or 'state'") in message
    for receiver in (Strategy.OUTBOX, Strategy.STATE):
        ok = Registry("test", (Registration(SET_ALGEBRA, strategy=Strategy.STATE),
                               Registration(AUDIT, strategy=receiver)))
        assert ok.errors() == []


def test_every_problem_is_listed_at_once() -> None:
    message = _refused(Registration(SET_ALGEBRA, strategy=Strategy.STATE),
                       Registration(BANK, role=Role.CALLEE, strategy=Strategy.OUTBOX))
    assert "sets sends to audit, which is not registered" in message
    assert "bank: a callee uses 'token'" in message


# --- strategies(): the defaults, with settings' overrides ------------------------------------


def test_strategies_are_the_defaults_without_overrides() -> None:
    assert REGISTRY.strategies() == {"front": Strategy.OUTBOX, "counter": Strategy.TOKEN,
                                     "audit": Strategy.TOKEN, "bank": Strategy.TOKEN}
    assert REGISTRY.strategies({}) == REGISTRY.strategies()


def test_overrides_replace_the_defaults_of_the_endpoints_they_name() -> None:
    chosen = REGISTRY.strategies({"audit": "state"})
    assert chosen == {"front": Strategy.OUTBOX, "counter": Strategy.TOKEN,
                      "audit": Strategy.STATE, "bank": Strategy.TOKEN}
    assert REGISTRY.strategies({"audit": Strategy.OUTBOX})["audit"] is Strategy.OUTBOX
    assert REGISTRY.strategies()["audit"] is Strategy.TOKEN  # the registry is unchanged


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"nope": "token"}, "nope: no such endpoint (the service has ['front', 'counter', "
                            "'audit', 'bank'])"),
        ({"audit": "exactly-once"}, "audit: unknown strategy 'exactly-once' (token, outbox or "
                                    "state)"),
        ({"front": "token"}, "front: a gateway uses 'outbox'"),
        ({"bank": "state"}, "bank: a callee uses 'token'"),
        ({"counter": "outbox"}, "counter=outbox: it calls HTTP callees, and the outbox path "
                                "reads no token"),
        ({"counter": "state"}, "counter=state: it creates blobs"),
        ({"counter": "state"}, "counter=state sends to audit, which uses 'token'"),
    ],
)
def test_overrides_the_registry_cannot_run_are_refused_naming_the_endpoint(
    overrides: dict[str, str], problem: str
) -> None:
    with pytest.raises(RegistryError) as caught:
        REGISTRY.strategies(overrides)
    assert problem in str(caught.value)


def test_a_receiver_switched_to_outbox_lets_its_sender_use_state() -> None:
    sets = Registry("sets", (Registration(SET_ALGEBRA), Registration(AUDIT)))
    with pytest.raises(RegistryError, match="sets=state sends to audit"):
        sets.strategies({"sets": "state"})
    assert sets.strategies({"sets": "state", "audit": "outbox"}) == {
        "sets": Strategy.STATE, "audit": Strategy.OUTBOX}


def test_a_message_key_must_be_its_classs_name() -> None:
    """Outgoing messages are typed by their class's name and incoming ones decoded by the
    key: a key that differs dead-lettered every message of that type (issue 24)."""
    renamed = replace(COUNTER, messages={"add": COUNTER.messages["Add"]})
    message = _refused(Registration(FRONT, role=Role.GATEWAY),
                       Registration(renamed, blobs=True, callees=("bank",)),
                       Registration(AUDIT), Registration(BANK, role=Role.CALLEE))
    assert "counter: message key 'add' is not the name of its class Add" in message
    assert "use 'Add'" in message
