"""A process's upkeep beside its work: the sweeper's rounds, the dead letters' rounds (collect,
expire, gauges), and a slow stop saying what it waits for (the background tasks are
cancelled for sure by `application.consumer_process.cancelled`)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import structlog

from adapters.rabbitmq.dead_letter_queue import DeadLetterCollector
from application.dead_letters import DeadLetters
from application.records import DeadLetterStatus
from application.sweeper import Sweeper
from application.workers import Workers
from entrypoints.status import Metrics

log = structlog.get_logger("eo.service")


async def sweep_forever(sweeper: Sweeper, workers: Workers, metrics: Metrics,
                        interval_s: float) -> None:
    """Every `interval_s` seconds, a sweep of the sweeper's endpoint (protocol 8) and, on a
    `state` endpoint, its stream's retention; sets the age of the oldest committed
    transaction record. A failed round is logged (`sweeper.failed`) and the next one runs."""
    name = sweeper.endpoint
    retention = workers.state_retention(name) if name in workers.streams else None
    while True:
        try:
            report = await sweeper.sweep()
            if any(vars(report).values()):
                log.info("sweeper.swept", endpoint=name, **vars(report))
            if retention is not None:  # a state endpoint: its stream is the dedup window
                dropped = await retention.sweep()
                if dropped:
                    log.info("sweeper.state_truncated", endpoint=name, entries=dropped)
            stale = await sweeper.store.committed_before(datetime.now(UTC))
            oldest = min((t.committed_at for t in stale if t.committed_at), default=None)
            age = (datetime.now(UTC) - oldest).total_seconds() if oldest else 0.0
            metrics.oldest.labels(sweeper.endpoint).set(age)
        except Exception as exc:  # noqa: BLE001 - the sweeper must outlive a bad round
            log.warning("sweeper.failed", endpoint=sweeper.endpoint, error=str(exc))
        await asyncio.sleep(interval_s)


async def dead_letters_forever(collector: DeadLetterCollector | None,
                               operations: DeadLetters, workers: Workers, metrics: Metrics,
                               endpoint: str, interval_s: float) -> None:
    """Every `interval_s` seconds: move the endpoint's dead-letter queue into the store
    (with a `collector`: `EO_DEAD_LETTER_COLLECT`), discard (and forget) what the retention
    says, and set the gauges: dead letters per endpoint and status, the tokens dead letters
    keep and the tokens in flight (the others)."""
    name = endpoint
    while True:
        try:
            moved = await collector.drain() if collector is not None else 0
            discarded, purged = await operations.expire()
            if moved or discarded or purged:
                log.info("dead_letters.kept", endpoint=name, moved=moved,
                         expired=discarded, forgotten=purged)
            gauges = await operations.gauges()
            for endpoint, counts in gauges.counts.items():
                for status in DeadLetterStatus:
                    metrics.dead_letters.labels(endpoint, str(status)).set(
                        counts.get(str(status), 0))
            metrics.dead_letter_tokens.set(gauges.tokens)
            metrics.tokens.set(await workers.tokens.count() - gauges.tokens)
        except Exception as exc:  # noqa: BLE001 - the upkeep must outlive a bad round
            log.warning("dead_letters.failed", endpoint=name, error=str(exc))
        await asyncio.sleep(interval_s)


#: how often a consumer that was told to stop says what it still waits for (seconds)
STOPPING_REPORT_S = 10.0


def _suspended_at(task: asyncio.Task[object]) -> str:
    """Where `task` waits: its innermost coroutine frames, outermost first."""
    frames = []
    awaited: object = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " > ".join(frames[-3:]) or repr(task.get_coro())


async def report_stopping(endpoint: str) -> None:
    """While a stop takes longer than `STOPPING_REPORT_S`, log `consumer.stopping` every
    `STOPPING_REPORT_S` with the seconds waited and where each other task waits: a stop
    that hangs says on what (a chaos campaign found one that outlasted 30 s)."""
    started = asyncio.get_running_loop().time()
    me = asyncio.current_task()
    while True:
        await asyncio.sleep(STOPPING_REPORT_S)
        tasks = sorted(_suspended_at(t) for t in asyncio.all_tasks() if t is not me)
        log.warning("consumer.stopping", endpoint=endpoint,
                    waited_s=round(asyncio.get_running_loop().time() - started, 1),
                    tasks=tasks)
