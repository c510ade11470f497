"""`eo bench`'s load shapes (tools/bench/shapes.py) and the bench endpoint's big states: how
shapes are written, how the accounts are drawn, how big a state is. Pure functions; the
shapes' runs on real processes are in test_bench.py."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest
import typer

from application.codec import to_jsonable
from domain.context import Context
from tools.bench import endpoint as bench
from tools.bench.cli import _shapes
from tools.bench.shapes import MIN_MESSAGES, Shape, account_picker, parse


@pytest.mark.parametrize("text", ["uniform", "one", "zipf:0.8", "zipf:1.2", "uniform@1k",
                                  "zipf:1.2@64k", "one@512k", "uniform@3000"])
def test_a_shape_reads_back_as_written(text: str) -> None:
    assert parse(text).label == text


def test_sizes_and_exponents_are_read() -> None:
    assert parse("zipf:1.2@64k") == Shape("zipf", 1.2, 65536)
    assert parse("one@1M") == Shape("one", 0.0, 1024 * 1024)
    assert parse(" uniform ") == Shape()


@pytest.mark.parametrize(("text", "says"), [
    ("zipf", "positive exponent"), ("zipf:-1", "positive exponent"),
    ("zipf:x", "positive exponent"), ("hot", "expected uniform, zipf"),
    ("uniform@big", "not a number of bytes"), ("one@10", "cannot hold one line")])
def test_a_bad_shape_is_named_with_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse(text)
    with pytest.raises(typer.BadParameter, match=says):  # what --shapes prints
        _shapes(f"uniform,{text}")


def test_zipf_gives_the_hottest_account_its_share_and_one_takes_them_all() -> None:
    """Over 1,000 accounts at s = 1.2 the hottest has 1 / H(1000, 1.2) = 23.1 % of the
    draws, the tenth 1.5 %; at s = 0.8, 6.5 %. 20,000 draws from a fixed seed: within a
    point of it (the draws' standard error is 0.3 point)."""
    def shares(shape: Shape) -> list[float]:
        draw = account_picker(shape, 1_000, random.Random(7))
        counts = Counter(draw() for _ in range(20_000))
        return [counts[k] / 20_000 for k in range(1_000)]

    hot = shares(parse("zipf:1.2"))
    assert hot[0] == pytest.approx(0.231, abs=0.01)
    assert hot[9] == pytest.approx(0.231 / 10**1.2, abs=0.005)
    assert shares(parse("zipf:0.8"))[0] == pytest.approx(0.0646, abs=0.01)
    flat = shares(Shape())
    assert max(flat) < 0.002
    assert sum(1 for s in flat if s) > 990
    assert shares(parse("one")) == [1.0] + [0.0] * 999


def test_the_same_seed_draws_the_same_accounts() -> None:
    def draws(seed: int) -> list[int]:
        pick = account_picker(parse("zipf:0.8"), 100, random.Random(seed))
        return [pick() for _ in range(50)]

    assert draws(3) == draws(3) != draws(4)


@pytest.mark.parametrize("size", [1024, 65536, 524288])
def test_a_big_state_is_about_its_size_and_a_deposit_changes_one_line(size: int) -> None:
    context = Context(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC))
    first = bench.handle(None, bench.Deposit("acct-1", 5, 1), context, state_bytes=size).state
    stored = len(json.dumps(to_jsonable(first)))
    assert 0.9 * size <= stored <= 1.05 * size, stored
    second = bench.handle(first, bench.Deposit("acct-1", 7, 2), context, state_bytes=size).state
    changed = [i for i, (a, b) in enumerate(zip(first.lines, second.lines, strict=True))
               if a != b]
    assert changed == [1]  # the line the count pointed at: one more of it
    assert second.lines[1].quantity == first.lines[1].quantity + 1
    assert (second.cents, second.count) == (12, 2)
    # the same account opens with the same lines in any process (the first deposit
    # changed line 0); another account with others
    opening = bench.opening_lines("acct-1", size)
    assert opening[1:] == first.lines[1:]
    assert opening[0].quantity + 1 == first.lines[0].quantity
    assert opening != bench.opening_lines("acct-2", size)


def test_without_a_size_the_state_is_the_small_balance() -> None:
    context = Context(uuid.uuid4(), uuid.uuid4(), datetime.now(UTC))
    state = bench.handle(None, bench.Deposit("a", 5, 1), context).state
    assert state == bench.Balance(5, 1)
    assert len(json.dumps(to_jsonable(state))) < 64


def test_a_big_state_drains_fewer_messages_but_never_fewer_than_the_minimum() -> None:
    assert Shape().messages_for(10_000) == 10_000
    assert parse("uniform@4k").messages_for(10_000) == 10_000
    assert parse("uniform@64k").messages_for(10_000) == 625  # the bytes of 4 KiB states
    assert parse("uniform@512k").messages_for(10_000) == MIN_MESSAGES
    assert parse("uniform@512k").messages_for(100) == 100  # never more than asked
