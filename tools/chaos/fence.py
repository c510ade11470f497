"""The fence scenarios of `eo chaos`: two scripted interleavings per endpoint that reach the
two halves of finish's fence (protocol 3.1) with real processes, deterministically.

Random faults reach the fence only when a stalled finisher happens to wake after another
consumer has finished its transaction and committed the next one on the same partition:
a campaign of minutes may never see it. These scenarios stage that interleaving with
`wait:<gate>` failpoints and the processes' own logs, on two consumers X and Y of one
endpoint and two messages M1, M2 that it commits on one partition:

1. Y commits M1 and crashes (`after_commit=crash@1`): M1's transaction is committed,
   unfinished, and M1 goes back to the queue.
2. X takes M1 (a prefetch of 1: it takes nothing else while it holds M1) and pauses, having
   read the transaction record committed to (M1, A1):
   - *attempt guard*: at `after_tr_load`, before finish's own fenced read;
   - *compare-and-clear*: at `after_publish_all`, after finish's fenced read (the record's
     version then), before its clear.
3. Y, restarted with the same rule, takes M2, finishes M1 first (the next message of a
   partition finishes its committed transaction), commits M2 and crashes: M2's transaction
   is committed, unfinished, and M2 goes back to the queue.
4. X goes on. Its finish of (M1, A1) must find the record committed to M2 and do nothing
   (the attempt guard), or its clear must fail on the changed version (the
   compare-and-clear); X drops M1 as a duplicate, then takes M2 and finishes its
   transaction.

Then the run ends as the random ones do (quiescence, the final sweep) and is checked the same
way against a fault-free embedded run of M1 and M2. A fence that lets X act clears M2's
record: M2's side effects are never published (or cleaned up as a loser's), and M2, whose
token is still there, is committed a second time; the checks report it.

M1 and M2 are two of the workload's messages that the fault-free run commits on the same
partition of the endpoint (tools/chaos/fence_pairs.py finds them); an endpoint the workload
gives no such pair is reported as skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from application.observability import FAULT_INJECTED, MESSAGE_DUPLICATE
from tools.chaos.workload import OutsideMessage

#: The fence's two halves, and where X pauses to reach each (step 2).
HALVES: dict[str, str] = {"attempt guard": "after_tr_load",
                          "compare-and-clear": "after_publish_all"}
#: How long each step may take to happen before the scenario reports it did not.
STEP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FencePair:
    """Two outside messages whose processing commits once each on `partition` of
    `endpoint`, in this order, after the messages `before` (processed first, without a
    fault: what the two need to find, such as an order opened before its items)."""

    endpoint: str
    partition: str
    first: OutsideMessage
    second: OutsideMessage
    before: tuple[OutsideMessage, ...] = ()
    #: the commits the messages `before` make, over every consuming endpoint
    before_commits: int = 0


class StepMissed(Exception):
    """A scripted step did not happen within its time: the message says which."""


@dataclass(frozen=True)
class Script:
    """What a fence scenario needs of the run around it: start a process with extra
    environment, whether a process has exited (its code) and read its current log,
    publish messages, and the gates directory."""

    start: Callable[[str, Mapping[str, str]], None]
    exit_code: Callable[[str], int | None]
    log: Callable[[str], list[dict[str, Any]]]
    publish: Callable[[Sequence[OutsideMessage]], Any]
    gates: Path


def process_names(endpoint: str) -> tuple[str, str]:
    """The scenario's two consumers of `endpoint`: X (the late finisher), Y."""
    return f"{endpoint}-0", f"{endpoint}-1"


def environment(gates: Path) -> dict[str, str]:
    """The two consumers' settings: one delivery in flight each and no batching (X holds M1
    and takes nothing else), sweepers that leave a committed transaction alone for a minute
    (the script, not a sweeper, finishes M1 and M2), and the gates directory."""
    return {"EO_PREFETCH": "1", "EO_BATCH_SIZE": "1", "EO_STALE_AFTER_S": "60",
            "EO_FAILPOINT_GATES": str(gates)}


async def stage_fence(script: Script, pair: FencePair, half: str, crash_exit: int,
                sleep: Callable[[float], Any]) -> None:
    """Steps 1-4 of the module's scenario for `half` (a key of `HALVES`) on `pair`; the
    other endpoints' processes are running already. Y is left dead (crashed at step 3) for
    the run's quiescence to restart. Raises `StepMissed` naming the step that did not
    happen within `STEP_TIMEOUT_S`; X's gate is open when it returns or raises."""
    x, y = process_names(pair.endpoint)
    env = environment(script.gates)
    point = HALVES[half]

    async def until(what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not done():
            if time.monotonic() > deadline:
                raise StepMissed(f"{what}: did not happen within {STEP_TIMEOUT_S:.0f} s")
            await sleep(0.1)

    async def crashed(what: str) -> None:
        await until(what, lambda: script.exit_code(y) is not None)
        if script.exit_code(y) != crash_exit:
            raise StepMissed(f"{what}: {y} exited {script.exit_code(y)}, not by its crash "
                             "failpoint")

    def fired(name: str, failpoint: str) -> bool:
        return any(r.get("event") == FAULT_INJECTED and r.get("failpoint") == failpoint
                   for r in script.log(name))

    crash = {**env, "EO_FAILPOINTS": "after_commit=crash@1"}
    try:
        script.start(y, crash)
        await script.publish([pair.first])
        await crashed(f"1. {y} commits M1 and crashes")
        script.start(x, {**env, "EO_FAILPOINTS": f"{point}=wait:x@1"})
        await until(f"2. {x} takes M1 and pauses at {point}", lambda: fired(x, point))
        script.start(y, crash)
        await script.publish([pair.second])
        await crashed(f"3. {y} finishes M1, commits M2 and crashes")
        (script.gates / "x").touch()
        await until(f"4. {x} drops M1 as a duplicate",
                    lambda: any(r.get("event") == MESSAGE_DUPLICATE for r in script.log(x)))
    finally:
        (script.gates / "x").touch()
