"""What a campaign's run is compared with (tools/chaos/reference.py): the aspects two
fault-free runs in two orders disagree on are not compared, which messages commit goes with
which are dead-lettered on every endpoint, what no two runs share is masked, and a
difference is named in words."""

from __future__ import annotations

from typing import Any

from entrypoints.testing import EmbeddedReport
from tools.chaos.reference import Expected, Observed, Reference, masked_state, observed

KEY = "labels/0b6f4d98-f4f0-5c7b-8421-f684547f1518"
OTHER_KEY = "labels/bed865f0-3583-5ee3-9e4b-ef80db14d82c"


def _observed(commits: int = 3, dead: tuple[str, ...] = (), tracking: Any = None,
              blobs: int = 2, destination: str = "lyon") -> Observed:
    return observed(["parcels", "tracking"], {"parcels": commits, "tracking": 2},
                    {"parcels": list(dead)},
                    {"parcels": {"p-1": {"label": KEY}},
                     "tracking": {destination: tracking or {"parcels": ["p-1", "p-2"]}}},
                    blobs, {"pickups": {"k1": 1, "k2": 1}})


def _reference(outcome: Observed) -> Reference:
    return Reference(EmbeddedReport(service="s"), {}, {}, outcome)


def test_two_runs_that_agree_compare_everything_and_name_each_difference() -> None:
    """A workload that declares its outcome independent of the order: the states too."""
    expected = Expected(_reference(_observed()), _reference(_observed()), order_independent=True)
    assert expected.varying == []
    found = _observed(commits=4, tracking={"parcels": ["p-1"]}, blobs=3)
    assert expected.differences(found) == [
        "blobs: 3 objects, the fault-free run wrote 2",
        "I10: parcels: 4 messages known committed (their commit, publications or token "
        "consumed in the logs), the fault-free run committed 3",
        "states: tracking: 1 partitions differ from the fault-free run's: lyon: "
        '{"parcels":["p-1"]} (fault-free: {"parcels":["p-1","p-2"]})']


def test_what_two_orders_disagree_on_is_not_compared() -> None:
    """The second run saw the parcels in the other order: tracking's states differ; a
    parcel refused in one order only makes every endpoint's commits and dead letters
    order-dependent (as many committed, not the same ones)."""
    expected = Expected(
        _reference(_observed(dead=("destination nice is full: parcel n-0",))),
        _reference(_observed(dead=("destination nice is full: parcel n-2",),
                             tracking={"parcels": ["p-2", "p-1"]})), order_independent=True)
    assert expected.varying == ["blobs", "commits on parcels", "commits on tracking",
                                "dead letters of parcels", "dead letters of tracking",
                                "executions on pickups", "states of tracking"]
    # a third order: other states, another parcel refused, one commit fewer, a blob more:
    # no violation
    found = _observed(commits=2, dead=("destination nice is full: parcel n-1",),
                      tracking={"parcels": ["p-1"]}, blobs=3)
    assert expected.differences(found) == []
    # what both orders agree on is still compared: the partitions
    assert expected.differences(_observed(destination="paris")) == [
        "states: tracking has partitions ['paris'] the fault-free run has not, and lacks "
        "['lyon']"]


def test_the_outcome_is_compared_only_where_the_workload_declares_it_order_independent(
        ) -> None:
    """Two orders may agree and a third not (an order completes at its last command): by
    default the partitions are compared, not the states, commits, dead letters, blobs or
    API executions."""
    expected = Expected(_reference(_observed()), _reference(_observed()))
    assert expected.differences(_observed(
        commits=2, dead=("refused",), tracking={"parcels": ["p-2", "p-1"]}, blobs=5)) == []
    assert expected.differences(_observed(destination="paris")) == [
        "states: tracking has partitions ['paris'] the fault-free run has not, and lacks "
        "['lyon']"]


def test_artifact_keys_and_timestamps_are_masked_other_ids_are_not() -> None:
    at = "2026-11-28T02:10:11.123456+00:00"
    assert masked_state({"label": KEY, "at": at}) == masked_state(
        {"label": OTHER_KEY, "at": "2026-11-28T03:00:00+00:00"})
    assert masked_state({"booking": "1e1b2c3d-0000-4000-8000-000000000001"}) != masked_state(
        {"booking": "1e1b2c3d-0000-4000-8000-000000000002"})
