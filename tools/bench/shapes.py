"""Load shapes of `eo bench` (docs/bench.md, "Load shapes"): how the deposits fall on the
accounts (partitions) and how big each account's state is.

A shape is written `<distribution>[@<state size>]`:

- `uniform`: every account equally likely (the bench's default);
- `zipf:<s>`: account k (1-based) with probability proportional to 1 / k**s (Zipf's law over
  the `--partitions` accounts; s = 0.8 and 1.2 are the issue's, a few hot accounts take most
  deposits: at s = 1.2 over 1,000 accounts the hottest takes about 24 %);
- `one`: every deposit on one account;
- `@<size>`: each account's state about that big once its first deposit is applied
  (`1k`, `64k`, `512k`, or bytes): order lines (`Line`), made from the account's name, one of
  which every deposit changes; without it the state is the small `Balance` of a few dozen
  bytes.

A shape with a state above 4 KiB runs fewer messages (`messages_for`): the same bytes of
state rewritten as 4 KiB states would, at least 500.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

_SIZE = re.compile(r"(?P<n>\d+)(?P<unit>[kKmM]?)")
#: states up to this many bytes run every message of `--messages`; bigger, fewer
FULL_RUN_STATE_BYTES = 4096
#: the fewest messages a shape's run drains
MIN_MESSAGES = 500


@dataclass(frozen=True)
class Shape:
    """A load's shape: `distribution` "uniform", "zipf" (exponent `s`) or "one";
    `state_bytes` the size of each account's state (0: the small balance)."""

    distribution: str = "uniform"
    s: float = 0.0
    state_bytes: int = 0

    @property
    def label(self) -> str:
        """The shape as written (`parse(shape.label) == shape`)."""
        name = f"zipf:{self.s:g}" if self.distribution == "zipf" else self.distribution
        if not self.state_bytes:
            return name
        size = self.state_bytes
        text = f"{size // 1024}k" if size % 1024 == 0 else str(size)
        return f"{name}@{text}"

    def messages_for(self, messages: int) -> int:
        """How many messages a run of this shape drains when the bench asks `messages`:
        all of them up to `FULL_RUN_STATE_BYTES` of state, else as many as rewrite the
        same bytes of state as 4 KiB states would, at least `MIN_MESSAGES` (never more
        than asked)."""
        if self.state_bytes <= FULL_RUN_STATE_BYTES:
            return messages
        return min(messages, max(MIN_MESSAGES,
                                 messages * FULL_RUN_STATE_BYTES // self.state_bytes))


def parse(text: str) -> Shape:
    """A shape from its written form (module docstring); raises ValueError naming what is
    wrong."""
    distribution, _, size = text.strip().partition("@")
    state_bytes = 0
    if size:
        match = _SIZE.fullmatch(size)
        if match is None:
            raise ValueError(f"{text!r}: the state size {size!r} is not a number of bytes, "
                             "optionally with k or m (64k)")
        unit = {"": 1, "k": 1024, "m": 1024 * 1024}[match["unit"].lower()]
        state_bytes = int(match["n"]) * unit
        if state_bytes < 64:
            raise ValueError(f"{text!r}: a state of {state_bytes} bytes cannot hold one line; "
                             "leave the size out for the small balance")
    if distribution in ("uniform", "one"):
        return Shape(distribution, 0.0, state_bytes)
    name, _, exponent = distribution.partition(":")
    if name == "zipf":
        try:
            s = float(exponent)
        except ValueError:
            s = -1.0
        if s <= 0:
            raise ValueError(f"{text!r}: zipf takes a positive exponent, e.g. zipf:1.2")
        return Shape("zipf", s, state_bytes)
    raise ValueError(f"{text!r}: expected uniform, zipf:<s> or one, optionally "
                     "followed by @<state size>")


def account_picker(shape: Shape, partitions: int, rng: random.Random) -> Callable[[], int]:
    """A function that draws the next deposit's account number (0 .. partitions - 1) as
    `shape` says, from `rng` (the same seed draws the same accounts). Zipf draws by
    bisection over the cumulative weights (`random.choices`): O(log partitions) a draw."""
    if shape.distribution == "one":
        return lambda: 0
    if shape.distribution == "uniform":
        return lambda: rng.randrange(partitions)
    cumulative = list(itertools.accumulate(1.0 / k ** shape.s for k in range(1, partitions + 1)))
    accounts = range(partitions)
    return lambda: rng.choices(accounts, cum_weights=cumulative)[0]
