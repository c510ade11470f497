"""What the services did during each of production's faults (`eo chaos --production`): read
from the processes' logs of a run, in a window from the fault's injection until `AFTER_S`
after its undoing (or the next fault's injection, when sooner), and written into its
`FaultRecord.reactions` for the report, e.g. `2 connections or consumers lost, back after
0.1-3.4 s; 2 consumers restarted; 5 received again; 3 retried; 0 conflicts; 0 dead-lettered`.

For a failover after a lagging standby, it also counts the transactions the services saw
committed while the standby lagged: with asynchronous replication those were acknowledged by
the primary alone, and the failover loses them (the run's violations then show what that
cost); with synchronous replication a commit waits for the standby, so there are none."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from application.observability import (
    CONSUMER_LOST,
    CONSUMER_RESTARTED,
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RECEIVED,
    MESSAGE_RETRIED,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
)
from tools.chaos.production import FaultRecord

#: how long after a fault's undoing its window lasts (seconds): the services' reconnection
#: back-off and the retry queues' delays fall within it
AFTER_S = 15.0
_LOST = re.compile(r"^connection to \S+ \(or its publishing channel\) lost")
_BACK = re.compile(r"^(?:recovered the connection to \S+|consuming \S+ again) after ([\d.]+) s")


def _when(record: Mapping[str, Any]) -> float | None:
    """A log record's time (the wall clock's, seconds), or None."""
    stamp = record.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def describe(records: Iterable[FaultRecord], logs: Iterable[Mapping[str, Any]]) -> None:
    """Set each fault record's `reactions` from the run's log records (every process's,
    killed ones included, in any order)."""
    timed = sorted(((t, r) for r in logs if (t := _when(r)) is not None),
                   key=lambda pair: pair[0])
    faults = sorted(records, key=lambda record: record.wall_at)
    for fault, after in zip(faults, [*faults[1:], None], strict=True):
        end = fault.wall_at + (fault.lasted_s or 0.0) + AFTER_S
        if after is not None:  # what follows the next fault is the next fault's
            end = min(end, after.wall_at)
        fault.reactions = _window(timed, fault.wall_at, end, fault.lag)


def _window(timed: list[tuple[float, Mapping[str, Any]]], start: float, end: float,
            lag: tuple[float, float] | None) -> str:
    seen: set[tuple[str, str]] = set()
    lost = restarted = again = retried = conflicts = dead = committed_in_lag = 0
    back: list[float] = []
    for t, record in timed:
        event = str(record.get("event", ""))
        key = (str(record.get("endpoint", "")), str(record.get("message_id", "")))
        if t < start:
            if event == MESSAGE_RECEIVED:
                seen.add(key)
            continue
        if t > end:
            break
        if lag is not None and lag[0] <= t <= lag[1] and event == TRANSACTION_COMMITTED:
            committed_in_lag += 1
        if event == MESSAGE_RECEIVED:
            again += key in seen
            seen.add(key)
        elif event == CONSUMER_LOST or _LOST.match(event):
            lost += 1
        elif event == CONSUMER_RESTARTED:
            restarted += 1
            if isinstance(after := record.get("after_s"), int | float):
                back.append(float(after))
        elif event == MESSAGE_RETRIED:
            retried += 1
        elif event == TRANSACTION_CONFLICT:
            conflicts += 1
        elif event == MESSAGE_DEAD_LETTERED:
            dead += 1
        elif (match := _BACK.match(event)) is not None:
            back.append(float(match.group(1)))
    parts = [f"{lost} connections or consumers lost"
             + (f", back after {min(back):.1f}-{max(back):.1f} s" if back else "")]
    parts += [f"{restarted} consumers restarted", f"{again} received again",
              f"{retried} retried", f"{conflicts} conflicts", f"{dead} dead-lettered"]
    if lag is not None:
        parts.append(f"{committed_in_lag} transactions committed while the standby lagged")
    return "; ".join(parts)
