"""Two copies of an HTTP follow-up: one finishes (DELETE sent, token not yet consumed) while
the other POSTs and gets 404. That copy is a duplicate, not a dead letter. Found by the local
demo: protocol 6's "404 while the follow-up token exists is permanent" races with finish,
which sends the DELETE before it consumes the token."""

from __future__ import annotations

import asyncio

from application.outcome import Outcome
from application.processor import Processor
from application.settlement import Settler
from tests.unit.application.test_http_protocol import (
    _open,
    _spend,
    _system,
    _take,
    _tally,
)


async def test_a_follow_up_copy_that_meets_the_deleted_request_is_a_duplicate() -> None:
    system = _system()
    _open(system, balance=1000)
    spend = await _spend(system)
    assert await system.processor("counter").process(spend) is Outcome.PROCESSED
    follow_up = (await _take(system.broker, "counter")).envelope

    def worker(spec: str) -> Processor:
        return system.worker("counter", spec)

    # copy B passes its token check while the partition is idle, then is slow to POST;
    # copy A meanwhile commits and its finish sends the DELETE, then stalls before it
    # consumes the token: B's POST meets a deleted request while the token still exists
    second = Settler(worker("after_token_check=sleep:100"))

    class Copy:
        envelope, attempt = follow_up, 1
        settled: list[str] = []

        async def ack(self) -> None:
            self.settled.append("ack")

        async def retry(self, delay_s: float, reason: str) -> None:
            self.settled.append(f"retry: {reason}")

        async def dead_letter(self, reason: str, endpoint: str) -> None:
            self.settled.append(f"dead letter: {reason}")

        async def release(self) -> None:
            self.settled.append("release")

    copy = Copy()
    settling = asyncio.create_task(second.settle(copy))
    await asyncio.sleep(0.02)
    first = asyncio.create_task(worker("after_delete=sleep:300").process(follow_up))
    assert await settling is Outcome.DUPLICATE, copy.settled
    assert await first is Outcome.PROCESSED
    assert _tally(system).spent == (100,)
    assert await system.requests.count() == 0
    assert await system.tokens.count() == 1  # only Reported's, for the audit
