"""Coalesced acks (`ChannelAcks`) against a model of a channel's delivery tags as RabbitMQ
keeps them: an ack for a tag that is not outstanding closes the channel (406 PRECONDITION
FAILED), a `multiple` ack settles every outstanding tag up to its own. The model also fails
the test when a frame acks a delivery its consumer had not settled yet: that message would be
lost if the consumer crashed before processing it."""

from __future__ import annotations

import asyncio
import random

import pytest
from aio_pika.exceptions import ChannelInvalidStateError

from adapters.rabbitmq.acks import ChannelAcks


class ModelChannel:
    """Tags 1..`delivered` outstanding; `settled` is what the consumer has settled."""

    def __init__(self, delivered: int) -> None:
        self.outstanding = set(range(1, delivered + 1))
        self.settled: set[int] = set()
        self.frames: list[tuple[int, bool]] = []
        self.fail: BaseException | None = None
        self.hang = False

    async def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        await asyncio.sleep(0)  # a write yields to the loop
        if self.hang:
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail
        if delivery_tag not in self.outstanding:
            raise AssertionError(f"406 PRECONDITION_FAILED - unknown delivery tag {delivery_tag}")
        covered = ({t for t in self.outstanding if t <= delivery_tag} if multiple
                   else {delivery_tag})
        early = covered - self.settled
        assert not early, f"acked before they were settled: {sorted(early)}"
        self.outstanding -= covered
        self.frames.append((delivery_tag, multiple))

    def reject(self, delivery_tag: int) -> None:
        self.settled.add(delivery_tag)
        self.outstanding.remove(delivery_tag)


async def settle(channel: ModelChannel, acks: ChannelAcks, tags: list[int]) -> None:
    """Settle `tags` together, as a batch's deliveries are (one task each)."""
    async def one(tag: int) -> None:
        channel.settled.add(tag)
        await acks.ack(tag)

    await asyncio.gather(*(one(t) for t in tags))


async def test_a_batch_settled_together_goes_in_two_frames() -> None:
    # the first ack goes at once, alone; the 49 asked while it is written go together
    channel = ModelChannel(50)
    acks = ChannelAcks(channel, timeout_s=1.0)
    order = random.Random(1).sample(range(1, 51), 50)
    await settle(channel, acks, order)
    assert channel.frames == [(order[0], False), (50, True)]
    assert (acks.frames, acks.acked) == (2, 50)
    assert not channel.outstanding


async def test_acks_above_a_delivery_in_flight_go_singly_then_the_run_resumes() -> None:
    channel = ModelChannel(8)
    acks = ChannelAcks(channel, timeout_s=1.0)
    await settle(channel, acks, [2, 3, 4])  # 1 is still being processed
    assert channel.frames == [(2, False), (3, False), (4, False)]
    await settle(channel, acks, [1])  # 1..4 settled now: the next run starts at 5
    await settle(channel, acks, [5, 6, 7])
    assert channel.frames[3:] == [(1, False), (5, False), (7, True)]
    await settle(channel, acks, [8])
    assert not channel.outstanding


async def test_a_delivery_rejected_without_it_does_not_stop_the_run() -> None:
    channel = ModelChannel(9)
    acks = ChannelAcks(channel, timeout_s=1.0)
    channel.reject(1)  # a malformed message, dead-lettered by the source
    acks.settled_singly(1)
    await settle(channel, acks, [2, 3, 4])
    assert channel.frames == [(2, False), (4, True)]  # 3..4 in one frame: 1 was reported
    channel.reject(6)
    await settle(channel, acks, [5])
    acks.settled_singly(6)
    await settle(channel, acks, [7, 8, 9])
    assert channel.frames[2:] == [(5, False), (7, False), (9, True)]
    assert not channel.outstanding


@pytest.mark.parametrize("seed", range(20))
async def test_any_settlement_order_acks_each_delivery_once_and_never_early(seed: int) -> None:
    rng = random.Random(seed)
    channel = ModelChannel(300)
    # the model channel writes at once: the bound is for a loaded machine, not the test's
    # subject (a flush of 300 tags took over 1 s in a full-suite run)
    acks = ChannelAcks(channel, timeout_s=30.0)
    order = rng.sample(range(1, 301), 300)
    waves = []
    while order:  # overlapping batches of random sizes, some tags rejected singly
        size = rng.randint(1, 40)
        waves.append(order[:size])
        del order[:size]

    async def wave(tags: list[int]) -> None:
        # the waves interleave by turns of the event loop, not by the clock: the same
        # schedule for a seed whatever the machine's load (a sleep of up to 1 ms let a
        # loaded machine run every wave in a turn of its own: nothing coalesced)
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        rejected = [t for t in tags if rng.random() < 0.05]
        for tag in rejected:
            channel.reject(tag)
            acks.settled_singly(tag)
        await settle(channel, acks, [t for t in tags if t not in rejected])

    await asyncio.gather(*(wave(w) for w in waves))
    assert not channel.outstanding  # each one acked (or rejected), none twice (406)
    # one frame per flush, never more frames than acks (that runs coalesce is the
    # deterministic tests' above: whether a random schedule coalesces any depends on it)
    assert acks.frames == len(channel.frames) <= acks.acked


async def test_a_failed_write_fails_every_ack_of_its_flush() -> None:
    channel = ModelChannel(3)
    acks = ChannelAcks(channel, timeout_s=1.0)
    channel.fail = ChannelInvalidStateError("channel closed")
    results = await asyncio.gather(*(acks.ack(t) for t in (1, 2, 3)),
                                   return_exceptions=True)
    assert all(r is channel.fail for r in results)


async def test_a_write_that_hangs_times_out_as_transient() -> None:
    channel = ModelChannel(1)
    channel.hang = True
    acks = ChannelAcks(channel, timeout_s=0.05)
    with pytest.raises(TimeoutError):
        await acks.ack(1)


async def test_a_cancelled_ack_leaves_the_others_of_its_flush_acked() -> None:
    channel = ModelChannel(3)
    acks = ChannelAcks(channel, timeout_s=1.0)
    channel.settled.update({1, 2, 3})
    tasks = [asyncio.create_task(acks.ack(t)) for t in (1, 2, 3)]
    await asyncio.sleep(0)  # all three asked; the flush has not written yet
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert results[0] is None
    assert results[2] is None
    assert isinstance(results[1], asyncio.CancelledError)
    # 1 went at once; 2 and 3 were asked meanwhile and share a frame, decided before 2's
    # cancellation: its delivery is acked all the same
    assert channel.frames == [(1, False), (3, True)]


async def test_a_channel_closing_under_an_ack_raises_the_drivers_channel_error() -> None:
    """aiormq fails a frame's write with a bare `Exception` when its connection closes with
    no reason (the `drop_conn` failpoint's close, seen in an `eo chaos --production` run):
    raised as it was, the ack's caller saw an error that is not the driver's and the batch's
    settling task died with "Task exception was never retrieved"."""
    channel = ModelChannel(1)
    channel.fail = Exception()
    acks = ChannelAcks(channel, timeout_s=1.0)
    channel.settled.add(1)
    with pytest.raises(ChannelInvalidStateError):
        await acks.ack(1)
