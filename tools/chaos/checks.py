"""What the chaos tests and `eo chaos` check in the processes' logs at quiescence, beyond the
sample's oracle (tools/tpch/oracle.py): the protocol's invariants (protocol 1) as far as the
logs can show them.

From the JSON logs of every process (killed ones included):
- every protocol event (`message.received`, `handler.invoked`, `transaction.committed`,
  `side_effect.published`) names its endpoint and message ID: one that does not cannot be
  checked, and is reported rather than skipped.
- I1: at most one `transaction.committed` per (endpoint, message ID). A process killed between
  its commit and the log line leaves the commit unlogged, so the logs give a lower bound: a
  second logged commit is a violation, a missing one is not (the oracle sees the state).
- I2: every received copy of a message ID has the same body (`message.received` logs the
  body's SHA-256 prefix, and a copy logged without it is a violation).
- I3: where a message's commit is logged, every side effect published for it names the
  committed attempt (output of another attempt would not match the committed state).
- I7: every `side_effect.published` of one incoming message names one attempt.
- Handler re-runs (`rerun_violations`): every attempt beyond the committed one was aborted
  visibly: a conflict, a delayed retry, or the death of its process by plan (only the attempt
  in progress when it died).

The stores and the broker at rest are checked by tools/chaos/at_rest.py.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from application.observability import (
    ATTEMPT_ABANDONED,
    HANDLER_INVOKED,
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RECEIVED,
    MESSAGE_RETRIED,
    SETTLEMENT_FAILED,
    SIDE_EFFECT_PUBLISHED,
    TRANSACTION_COMMITTED,
    TRANSACTION_CONFLICT,
)

#: The events the log audit attributes to (endpoint, message ID).
PROTOCOL_EVENTS = frozenset({MESSAGE_RECEIVED, HANDLER_INVOKED, TRANSACTION_COMMITTED,
                             SIDE_EFFECT_PUBLISHED, ATTEMPT_ABANDONED})
#: At most this many violations are listed per invariant (the rest are counted).
MAX_LISTED = 10


def read_logs(log_dir: Path, pattern: str = "*.jsonl") -> list[dict[str, Any]]:
    """Every JSON line of the logs in `log_dir` (lines that are not JSON objects, e.g. a
    traceback or a line cut by SIGKILL, are skipped). Order: file by file, line by line."""
    records: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob(pattern)):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # the last line of a killed process may be cut short
    return records


@dataclass
class LogAudit:
    """The log-based checks' result: `violations` (empty when I1, I2 and I7 hold) and per
    (endpoint, message ID) counts of handler runs, logged commits and received copies.
    `handler_runs` leaves out the runs a batch abandoned (`abandoned`: it ran the handler,
    then left the message to the single path before anything was durable)."""

    violations: list[str] = field(default_factory=list)
    handler_runs: Counter[tuple[str, str]] = field(default_factory=Counter)
    abandoned: Counter[tuple[str, str]] = field(default_factory=Counter)
    commits: Counter[tuple[str, str]] = field(default_factory=Counter)
    received: Counter[tuple[str, str]] = field(default_factory=Counter)

    def runs(self, endpoint: str, message_id: object) -> int:
        """Handler runs logged for `message_id` at `endpoint`."""
        return self.handler_runs[(endpoint, str(message_id))]


def audit_logs(records: Iterable[dict[str, Any]]) -> LogAudit:
    """Check I1, I2 and I7 on the processes' log `records` (see the module docstring)."""
    audit = LogAudit()
    digests: dict[tuple[str, str], set[str]] = defaultdict(set)
    publishers: dict[tuple[str, str], set[str]] = defaultdict(set)
    committers: dict[tuple[str, str], set[str]] = defaultdict(set)
    unattributed: list[str] = []
    undigested: list[str] = []
    for record in records:
        event = record.get("event")
        if event not in PROTOCOL_EVENTS:
            continue
        endpoint, message_id = record.get("endpoint"), record.get("message_id")
        if not endpoint or not message_id:
            missing = [what for what, value in (("an endpoint", endpoint),
                                                ("a message ID", message_id)) if not value]
            unattributed.append(f"{event} without {' or '.join(missing)}: {record}")
            continue
        key = (str(endpoint), str(message_id))
        if event == MESSAGE_RECEIVED:
            audit.received[key] += 1
            if record.get("body_sha256"):
                digests[key].add(str(record["body_sha256"]))
            else:
                undigested.append(f"{key[0]} received {key[1]} without a body digest")
        elif event == HANDLER_INVOKED:
            audit.handler_runs[key] += 1
        elif event == ATTEMPT_ABANDONED:
            audit.handler_runs[key] -= 1
            audit.abandoned[key] += 1
        elif event == TRANSACTION_COMMITTED:
            audit.commits[key] += 1
            committers[key].add(str(record.get("attempt_id")))
        elif event == SIDE_EFFECT_PUBLISHED:
            publishers[key].add(str(record.get("attempt_id")))
    _report(audit, "unattributed", unattributed)
    _report(audit, "I1", (f"{e} committed {m} {n} times"
                          for (e, m), n in sorted(audit.commits.items()) if n > 1))
    _report(audit, "I2", undigested)
    _report(audit, "I2", (f"{e} received {len(d)} different bodies for {m}"
                          for (e, m), d in sorted(digests.items()) if len(d) > 1))
    _report(audit, "I3", (f"{e} published side effects of {m} from attempt(s) "
                          f"{sorted(a - committers[(e, m)])}, not the committed "
                          f"{sorted(committers[(e, m)])}"
                          for (e, m), a in sorted(publishers.items())
                          if committers.get((e, m)) and a - committers[(e, m)]))
    _report(audit, "I7", (f"{e} published side effects of {m} from {len(a)} attempts"
                          for (e, m), a in sorted(publishers.items()) if len(a) > 1))
    return audit


def crashed_by_failpoint(log: Path) -> bool:
    """Whether the process log `log` ends a life ended by a `crash` failpoint: the line
    `failpoint <name>: crash` it writes on stderr before exiting (entrypoints/faults.py)."""
    if not log.exists():
        return False
    return any(re.fullmatch(r"failpoint \S+: crash", line)
               for line in log.read_text(errors="replace").splitlines())


def open_attempts(log: Iterable[Mapping[str, Any]]) -> list[tuple[tuple[str, str], str]]:
    """((endpoint, message ID), attempt ID) of every attempt one process's `log` started
    (`handler.invoked`) and did not end: no `transaction.committed` or `attempt.abandoned`
    of that attempt, no `transaction.conflict`, `message.retried` or
    `message.dead_lettered` of its message after it: each of those ends one attempt of its
    message, the earliest still open (they name no attempt, and two copies of a message may
    run at once in one process: a duplicate beside its original). In log order."""
    pending: dict[str, tuple[str, str]] = {}
    for r in log:
        event, attempt = r.get("event"), str(r.get("attempt_id"))
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        if event == HANDLER_INVOKED:
            pending[attempt] = key
        elif event in (TRANSACTION_COMMITTED, ATTEMPT_ABANDONED):
            pending.pop(attempt, None)
        elif event in (TRANSACTION_CONFLICT, MESSAGE_RETRIED, MESSAGE_DEAD_LETTERED) or (
                event == SETTLEMENT_FAILED and r.get("settlement") in ("retry", "dead_letter")):
            ended = next((a for a, k in pending.items() if k == key), None)
            if ended is not None:
                pending.pop(ended)
    return [(key, attempt) for attempt, key in pending.items()]


def rerun_violations(records: Iterable[Mapping[str, Any]],
                     deaths: Iterable[Sequence[Mapping[str, Any]]]) -> list[str]:
    """Handler runs protocol 3.4 does not allow, from every process's log `records`: at most
    one attempt of a message commits, and every other attempt was aborted visibly, by a
    `transaction.conflict`, `message.retried`, `attempt.abandoned` or `message.dead_lettered`
    of that message, a
    `message.settlement_failed` of its retry or dead letter (the connection was lost: the
    broker redelivers it), or by a planned death.

    `deaths`: the log records of each process that died *by plan* (a `crash` failpoint's
    exit, a SIGKILL the harness sent); of each, only the attempts in progress when it died
    count as aborted: those it started (`handler.invoked`) and did not end in its log (no
    commit or abandon of that attempt, no conflict, retry or dead letter of its message
    after it). A batch has many in progress at once. An exit nobody planned excuses
    nothing. Returns one line per message in violation."""
    attempts: dict[tuple[str, str], set[str]] = defaultdict(set)
    committed: dict[tuple[str, str], set[str]] = defaultdict(set)
    aborts: Counter[tuple[str, str]] = Counter()
    for r in records:
        key = (str(r.get("endpoint")), str(r.get("message_id")))
        event = r.get("event")
        if event == HANDLER_INVOKED:
            attempts[key].add(str(r.get("attempt_id")))
        elif event == TRANSACTION_COMMITTED:
            committed[key].add(str(r.get("attempt_id")))
        elif event in (TRANSACTION_CONFLICT, MESSAGE_RETRIED, ATTEMPT_ABANDONED,
                       MESSAGE_DEAD_LETTERED):
            aborts[key] += 1  # (a dead letter: the attempt ended visibly, never to commit)
        elif event == SETTLEMENT_FAILED and r.get("settlement") in ("retry", "dead_letter"):
            aborts[key] += 1  # its retry could not be published: the broker redelivers it
    for log in deaths:
        for key, attempt in open_attempts(log):
            if attempt not in committed[key]:
                aborts[key] += 1
    problems = []
    for key, ids in sorted(attempts.items()):
        wins = committed.get(key, set())
        if len(wins) > 1:
            problems.append(f"{key}: {len(wins)} attempts committed")
        extra = len(ids) - len(wins & ids)
        if extra > aborts[key]:
            problems.append(f"{key}: {len(ids)} handler runs, {len(wins)} committed, only "
                            f"{aborts[key]} visible aborts (conflict, retry, planned death)")
    return problems


def _report(audit: LogAudit, invariant: str, found: Iterable[str]) -> None:
    items = list(found)
    audit.violations += [f"{invariant}: {text}" for text in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        audit.violations.append(f"{invariant}: ... {len(items) - MAX_LISTED} more")
