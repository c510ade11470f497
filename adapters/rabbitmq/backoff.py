"""The reconnection back-off: the pauses between tries at reaching the broker again, and the
loop that tries until a deadline (`reconnecting`). A running connection, a consumer that
lost its channel and a process's start-up all wait through it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from application.errors import TransientError

#: Pauses between reconnection attempts (seconds); the last one repeats.
RECONNECT_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)

T = TypeVar("T")


def backoff(delays_s: Sequence[float], attempt: int) -> float:
    """The pause in seconds before reconnection attempt `attempt` (0-based):
    `delays_s[attempt]`, the last delay repeating."""
    return delays_s[min(attempt, len(delays_s) - 1)]


async def reconnecting(step: Callable[[], Awaitable[T]], deadline: float,
                       delays_s: Sequence[float] = RECONNECT_DELAYS_S,
                       transient: tuple[type[BaseException], ...] = (TransientError,),
                       waiting: Callable[[BaseException, float], None] | None = None) -> T:
    """`await step()` until it returns its result: the reconnection backoff (not the
    processor's immediate re-attempts after a conflict, nor a delivery's delayed redelivery
    through the retry queues). After a failure of `transient`, pause
    `backoff(delays_s, attempt)` seconds (cut short at `deadline`) and try again; once the
    event loop's clock (`loop.time()`, seconds) has reached `deadline`, that failure is
    raised instead. `waiting(failure, pause_s)` is called before each pause (to log it) and
    may raise to stop. Other errors propagate at once, untried again."""
    loop = asyncio.get_running_loop()
    attempt = 0
    while True:
        try:
            return await step()
        except transient as failure:
            left = deadline - loop.time()
            if left <= 0:
                raise
            pause = min(backoff(delays_s, attempt), left)
            if waiting is not None:
                waiting(failure, pause)
            await asyncio.sleep(pause)
            attempt += 1
