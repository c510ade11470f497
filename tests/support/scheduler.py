"""A deterministic scheduler that switches between workers at every port call, and a
stateless explorer of its schedules with bounded preemptions and crashes.

Source: iterative context bounding, Musuvathi & Qadeer, "Iterative context bounding for
systematic testing of multithreaded programs", PLDI 2007: most concurrency bugs show up
with few preemptions, so enumerating every schedule with at most k preemptions (and here at
most c crashes) is both exhaustive within the bound and small enough to run.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from application.errors import Crash

Choice = tuple[int, bool]  # (worker, crash it instead of letting it run)


@dataclass(frozen=True)
class Step:
    enabled: tuple[int, ...]
    current: int | None
    choice: Choice
    preemptions: int  # before this step
    crashes: int  # before this step


class GatedPort:
    """Forwards to `target`; every coroutine method first waits for the scheduler."""

    def __init__(self, target: Any, run: Run, worker: int, name: str) -> None:
        self._target, self._run, self._worker, self._name = target, run, worker, name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._target, attr)
        if not inspect.iscoroutinefunction(value):
            return value

        async def gated(*args: Any, **kwargs: Any) -> Any:
            await self._run.gate(self._worker, f"{self._name}.{attr}")
            return await value(*args, **kwargs)

        return gated


@dataclass
class Run:
    """One schedule: follows `prefix`, then the non-preemptive default."""

    prefix: list[Choice]
    trace: list[Step] = field(default_factory=list)
    waiting: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    crashed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._progress = asyncio.Event()
        self._gates: dict[int, asyncio.Lock] = {}

    async def gate(self, worker: int, label: str) -> None:
        """Wait until the schedule lets `worker` make this call (raise `Crash` when it
        crashes it). The tasks of one worker (a batch's concurrent publications, say) pass
        its gate one at a time, in arrival order; a crashed worker's tasks all stop."""
        lock = self._gates.setdefault(worker, asyncio.Lock())
        async with lock:
            if worker in self.crashed:
                raise Crash(f"worker {worker} crashed before {label}")
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self.waiting[worker] = fut
            self._progress.set()
            if await fut:
                raise Crash(f"worker {worker} at {label}")

    async def execute(
        self,
        workers: dict[int, Callable[[int], Awaitable[None]]],
        on_crash: Callable[[int], tuple[int, Callable[[int], Awaitable[None]]] | None],
    ) -> None:
        tasks: dict[int, asyncio.Task[None]] = {}

        def start(wid: int, body: Callable[[int], Awaitable[None]]) -> None:
            task = asyncio.ensure_future(body(wid))
            task.add_done_callback(lambda _t: self._progress.set())
            tasks[wid] = task

        for wid, body in workers.items():
            start(wid, body)
        current: int | None = None
        preemptions = crashes = 0
        while True:
            while not all(t.done() or w in self.waiting for w, t in tasks.items()):
                self._progress.clear()
                await self._progress.wait()
            enabled = tuple(sorted(self.waiting))
            if not enabled:
                break
            i = len(self.trace)
            if i < len(self.prefix):
                choice = self.prefix[i]
            else:
                choice = (current if current in enabled else enabled[0], False)
            self.trace.append(Step(enabled, current, choice, preemptions, crashes))
            wid, crash = choice
            if crash:
                crashes += 1
                self.crashed.append(wid)
            elif current in enabled and wid != current:
                preemptions += 1
            self.waiting.pop(wid).set_result(crash)
            if crash:
                await asyncio.sleep(0)
                replacement = on_crash(wid)
                if replacement is not None:
                    start(*replacement)
                current = None if wid == current else current
            else:
                current = wid
        for task in tasks.values():
            if not task.cancelled() and task.exception() is not None \
                    and not isinstance(task.exception(), Crash):
                raise task.exception()  # type: ignore[misc]


def children(trace: list[Step], start: int, max_preemptions: int, max_crashes: int,
             symmetric: tuple[frozenset[int], ...] = ()) -> list[list[Choice]]:
    """Prefixes of the schedules that differ from `trace` first at a step >= `start`.

    `symmetric`: groups of interchangeable workers (copies of one delivery, in one state at
    the start, their ports alike). While two of a group have both not been scheduled yet,
    a schedule that starts the higher-numbered one first is its mirror's with the two
    swapped (the same steps in the same order, so the same IDs drawn, preemptions and
    crashes counted alike): only the lower-numbered one is tried there. Source: symmetry
    reduction, Ip & Dill, "Better verification through symmetry", FMSD 9 (1996)."""
    out = []
    touched = {s.choice[0] for s in trace[:start]}
    for i in range(start, len(trace)):
        step = trace[i]
        for wid in step.enabled:
            if wid not in touched and any(
                    wid in group and any(w < wid and w not in touched and w in step.enabled
                                         for w in group) for group in symmetric):
                continue  # a mirror of a schedule that starts the lower twin first
            for crash in (False, True):
                if (wid, crash) == step.choice:
                    continue
                if crash and step.crashes >= max_crashes:
                    continue
                preempts = (not crash and step.current in step.enabled and wid != step.current)
                if step.preemptions + preempts > max_preemptions:
                    continue
                out.append([s.choice for s in trace[:i]] + [(wid, crash)])
        touched.add(step.choice[0])
    return out


async def explore(
    run_one: Callable[[list[Choice]], Awaitable[Run]],
    max_preemptions: int,
    max_crashes: int,
    limit: int,
    stop: Callable[[], bool] | None = None,
    symmetric: tuple[frozenset[int], ...] = (),
) -> int:
    """Depth-first over every schedule within the bounds (at most `limit` of them), in a
    fixed order, one of each pair of mirrors among `symmetric` workers (`children`);
    `run_one(prefix)` runs and checks one; `stop()` ends early. Returns the number
    explored."""
    stack: list[list[Choice]] = [[]]
    explored = 0
    while stack and explored < limit and not (stop and stop()):
        prefix = stack.pop()
        run = await run_one(prefix)
        explored += 1
        stack.extend(reversed(children(run.trace, len(prefix), max_preemptions, max_crashes,
                                       symmetric)))
    return explored


async def run_deliveries(
    run: Run,
    deliveries: list[Any],
    make_processor: Callable[[int], Any],
    settle_errors: tuple[type[BaseException], ...],
    make_batch_processor: Callable[[int], Any] | None = None,
) -> None:
    """One worker per delivery under `run`, each with `make_processor(worker_id)`, retrying
    on `settle_errors` as a broker redelivers; a crashed worker's delivery is redelivered to
    a new worker (a new process). A delivery that is a list is a batch
    (`Processor.process_batch`, on `make_batch_processor(worker_id)` when given): its
    deliveries that ended in `settle_errors` are redelivered together, and after a crash
    the whole batch is."""
    by_worker: dict[int, Any] = {}

    def worker_for(envelope: Any) -> Callable[[int], Awaitable[None]]:
        async def body(wid: int) -> None:
            batched = isinstance(envelope, list)
            processor = (make_batch_processor or make_processor)(wid) if batched \
                else make_processor(wid)
            by_worker[wid] = envelope
            if batched:  # a batch: its unsettled deliveries come back
                pending = envelope
                for _ in range(10):
                    results = await processor.process_batch(pending)
                    for result in results:
                        if isinstance(result, BaseException) \
                                and not isinstance(result, settle_errors):
                            raise result
                    pending = [e for e, r in zip(pending, results, strict=True)
                               if isinstance(r, settle_errors)]
                    if not pending:
                        return
                return
            for _ in range(10):  # what the broker does: redeliver until settled
                try:
                    await processor.process(envelope)
                    return
                except settle_errors:
                    continue
        return body

    workers = {i: worker_for(e) for i, e in enumerate(deliveries)}
    next_id = [len(workers)]

    def redeliver(wid: int) -> tuple[int, Callable[[int], Awaitable[None]]]:
        next_id[0] += 1
        return next_id[0], worker_for(by_worker.get(wid, deliveries[wid]))

    await run.execute(workers, redeliver)
