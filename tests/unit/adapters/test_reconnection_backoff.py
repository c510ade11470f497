"""The reconnection backoff a running broker connection and a process's start-up share
(`reconnecting`), and the broker refusals that no wait fixes (`refusal`)."""

from __future__ import annotations

import asyncio

import pytest
from aio_pika.exceptions import (
    ChannelPreconditionFailed,
    ConnectionClosed,
    ProbableAuthenticationError,
)
from aiormq.exceptions import ChannelAccessRefused

from adapters.rabbitmq.backoff import reconnecting
from adapters.rabbitmq.errors import refusal
from application.errors import PermanentError, TransientError


class Flaky:
    """A step that raises `TransientError("down <n>")` on its first `failures` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientError(f"down {self.calls}")
        return "up"


async def test_the_step_is_tried_again_after_each_backoff_pause_until_it_succeeds() -> None:
    step, pauses = Flaky(3), []
    deadline = asyncio.get_running_loop().time() + 60
    result = await reconnecting(step, deadline, delays_s=(0.01, 0.02),
                           waiting=lambda error, pause: pauses.append((str(error), pause)))
    assert result == "up"
    # the last delay repeats
    assert pauses == [("down 1", 0.01), ("down 2", 0.02), ("down 3", 0.02)]


async def test_at_the_deadline_the_last_failure_is_raised() -> None:
    step, pauses = Flaky(1000), []
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TransientError) as raised:
        await reconnecting(step, started + 0.2, delays_s=(0.03,),
                      waiting=lambda _, pause: pauses.append(pause))
    took = loop.time() - started
    assert str(raised.value) == f"down {step.calls}"
    assert took >= 0.2  # never before the deadline (a loaded machine only makes it later)
    # each pause lasts its 0.03 s at least, cut short only at the deadline: no more tries
    # than fit before it, plus the one at it (however slow the machine, never more)
    assert step.calls <= int(0.2 / 0.03) + 2
    assert len(pauses) == step.calls - 1
    # the pause before the deadline is cut short: one more try at the deadline, then no more
    assert max(pauses) == 0.03
    assert pauses[-1] <= 0.03
    assert step.calls == len(pauses) + 1


async def test_a_deadline_already_passed_means_one_try() -> None:
    step = Flaky(1)
    with pytest.raises(TransientError):
        await reconnecting(step, asyncio.get_running_loop().time())
    assert step.calls == 1


async def test_other_errors_end_the_retries_at_once() -> None:
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise PermanentError("no schema")

    with pytest.raises(PermanentError):
        await reconnecting(refused, asyncio.get_running_loop().time() + 60)
    assert calls == 1


async def test_the_waiting_hook_may_end_the_retries() -> None:
    step = Flaky(5)

    def waiting(error: BaseException, pause_s: float) -> None:
        raise PermanentError(f"gave up on {error}")

    with pytest.raises(PermanentError, match="gave up on down 1"):
        await reconnecting(step, asyncio.get_running_loop().time() + 60, waiting=waiting)
    assert step.calls == 1


async def test_driver_errors_are_retried_when_named() -> None:
    calls = 0

    async def reconnect() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionRefusedError(111, "Connect call failed")
        return calls

    assert await reconnecting(reconnect, asyncio.get_running_loop().time() + 60, (0.001,),
                         transient=(OSError,)) == 2


def _raised_from(cause: BaseException) -> TransientError:
    try:
        try:
            raise cause
        except type(cause) as exc:
            raise TransientError(f"connecting: {exc}") from exc
    except TransientError as wrapped:
        return wrapped


@pytest.mark.parametrize("cause", [
    ProbableAuthenticationError("ACCESS_REFUSED - Login was refused"),
    ChannelAccessRefused(403, "ACCESS_REFUSED - configure access refused"),
    ChannelPreconditionFailed(406, "PRECONDITION_FAILED - inequivalent arg"),
], ids=["credentials", "permission", "queue_arguments"])
def test_a_refusal_is_found_behind_the_transient_error(cause: BaseException) -> None:
    assert refusal(_raised_from(cause)) is cause


@pytest.mark.parametrize("cause", [
    ConnectionClosed(320, "CONNECTION_FORCED - broker forced connection closure"),
    ConnectionRefusedError(111, "Connect call failed"),
    TimeoutError(),
], ids=["connection_forced", "refused", "timeout"])
def test_what_a_wait_may_fix_is_no_refusal(cause: BaseException) -> None:
    assert refusal(_raised_from(cause)) is None
