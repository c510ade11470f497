"""A consumer's stop ends its background tasks even when one swallows its cancellation (a
library call in progress may: seen in the template test, a dead-letter round that finished
after its task was cancelled, then slept on, holding the process for ever)."""

from __future__ import annotations

import asyncio

import pytest

from application import consumer_process
from application.consumer_process import cancelled


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(consumer_process, "CANCEL_AGAIN_S", 0.05)
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 1:
                    continue  # the first one is lost, as inside a library call
                raise

    async def failing() -> None:
        raise RuntimeError("an upkeep round's error")

    tasks = [asyncio.create_task(stubborn()), asyncio.create_task(failing()),
             asyncio.create_task(asyncio.sleep(3600))]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancelled(tasks), 5)
    assert swallowed == 2
    assert all(t.done() for t in tasks)
    assert tasks[0].cancelled()
