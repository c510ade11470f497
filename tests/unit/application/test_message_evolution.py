"""A message type that changes between releases while copies of the previous release's
messages are in flight (docs/upgrading.md, "Messages and states that change"): what the
codec, the consumers' decoder, does with them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from application.codec import decode, encode
from application.errors import MalformedMessage


@dataclass(frozen=True)
class Ship:
    """Release N's message."""

    parcel: str
    grams: int


@dataclass(frozen=True)
class ShipWithInsurance:
    """Release N+1's: a field added with a default."""

    parcel: str
    grams: int
    insured_cents: int = 0


@dataclass(frozen=True)
class ShipNeedingInsurance:
    """Release N+1's, done wrong: a field added without a default."""

    parcel: str
    grams: int
    insured_cents: int


@dataclass(frozen=True)
class ShipWithoutGrams:
    """A later release's: a field dropped."""

    parcel: str


OLD = encode(Ship("p-1", 500))


def test_a_field_added_with_a_default_reads_the_old_copies() -> None:
    assert decode(ShipWithInsurance, OLD) == ShipWithInsurance("p-1", 500, 0)


def test_a_field_added_without_a_default_dead_letters_the_old_copies() -> None:
    with pytest.raises(MalformedMessage, match="malformed ShipNeedingInsurance: "
                                               "insured_cents: Field required"):
        decode(ShipNeedingInsurance, OLD)


def test_a_field_dropped_ignores_it_in_the_old_copies() -> None:
    assert decode(ShipWithoutGrams, OLD) == ShipWithoutGrams("p-1")


def test_the_previous_release_reads_the_new_copies_of_an_added_field_and_drops_it() -> None:
    """During a rolling upgrade the previous release's workers take new copies too: they
    read them (the added field ignored) and act without it, which the release that adds a
    field must allow (expand: nothing may depend on it until every worker knows it)."""
    new = encode(ShipWithInsurance("p-1", 500, 2_000))
    assert decode(Ship, new) == Ship("p-1", 500)
