"""The verdict on a stopped run of a campaign (`eo chaos`, tools/chaos/engine.py): the
protocol's checks from the processes' logs and the stores at rest (tools/chaos/checks.py),
nothing lost whatever the order (`unaccounted`), the blobs and third-party API executions,
the outcome against the fault-free runs (tools/chaos/reference.py), and the workload's
domain check."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from adapters.s3.blob_store import S3BlobStore
from application.codec import to_jsonable
from application.observability import (
    MESSAGE_DEAD_LETTERED,
    MESSAGE_RECEIVED,
    SIDE_EFFECT_PUBLISHED,
    TOKEN_CONSUMED,
    TRANSACTION_COMMITTED,
)
from domain.context import ARTIFACT_KEY_IN_TEXT
from entrypoints.service_spec import Service
from entrypoints.settings import Settings
from tools.chaos.at_rest import at_rest, dead_letters, kept_at_rest
from tools.chaos.checks import audit_logs, read_logs, rerun_violations
from tools.chaos.fleet import bucket_client, business_states
from tools.chaos.reference import Expected, observed
from tools.chaos.report import EngineRun
from tools.chaos.workload import FileWorkload, OutsideMessage, RunOutcome, Workload
from tools.fake_provider import FakeProvider

#: An object key `Context.artifact_key` makes, `<prefix>/<uuid5>`, where a state names it.
_ARTIFACT_KEY = re.compile(ARTIFACT_KEY_IN_TEXT)


#: The events that show a message's transaction committed: its own commit, and what only a
#: committed attempt's finish does (whoever finishes it: a process killed after its commit
#: logged none of its own), publish the attempt's side effects and consume its token.
COMMIT_EVIDENCE = frozenset({TRANSACTION_COMMITTED, SIDE_EFFECT_PUBLISHED, TOKEN_CONSUMED})
_EVIDENCE = tuple(f'"{event}"'.encode() for event in COMMIT_EVIDENCE)


class CommitCounter:
    """The distinct (endpoint, message ID) whose transaction the processes of a run are
    known to have committed (`COMMIT_EVIDENCE` in their logs), read from the logs as they
    grow: the run's progress, and at the end what is compared with the reference's."""

    def __init__(self, log_dir: Path, endpoints: Iterable[str]) -> None:
        self.log_dir, self.endpoints = log_dir, frozenset(endpoints)
        self._offsets: dict[Path, int] = {}
        self._seen: set[tuple[str, str]] = set()

    def count(self) -> int:
        for path in sorted(self.log_dir.glob("*.jsonl")):
            with path.open("rb") as log:
                log.seek(self._offsets.get(path, 0))
                data = log.read()
            end = data.rfind(b"\n") + 1  # a line being written waits for the next look
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in data[:end].splitlines():
                if not line.startswith(b"{") or not any(e in line for e in _EVIDENCE):
                    continue
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record.get("event") in COMMIT_EVIDENCE and record.get(
                            "endpoint") in self.endpoints:
                        self._seen.add((record["endpoint"], str(record.get("message_id"))))
        return len(self._seen)


def committed_in(records: Iterable[Mapping[str, Any]], endpoints: Iterable[str]
                 ) -> set[tuple[str, str]]:
    """(endpoint, message ID) of `endpoints` with `COMMIT_EVIDENCE` in the log `records`
    (what `CommitCounter` counts, from records already read)."""
    wanted = frozenset(endpoints)
    return {(str(r["endpoint"]), str(r.get("message_id"))) for r in records
            if r.get("event") in COMMIT_EVIDENCE and r.get("endpoint") in wanted}


def blob_findings(blobs: Sequence[str], named: str, reference_count: int | None
                  ) -> list[str]:
    """The bucket's keys `blobs` against the states' JSON text `named`: objects no state
    names (orphans), artifact keys a state names that are not in the bucket (missing), and a
    count other than the fault-free run's (`reference_count`; None: not compared, the
    campaign compares it with the other aspects); at most 10 lines of each kind."""
    found = [f"orphan: object {k} is named by no state" for k in blobs if k not in named]
    present = set(blobs)
    missing = sorted({k for k in _ARTIFACT_KEY.findall(named) if k not in present})
    found = found[:10] + [f"missing: a state names object {k}, which is not in the bucket"
                          for k in missing[:10]]
    if reference_count is not None and len(blobs) != reference_count:
        found.append(f"blobs: {len(blobs)} objects, the fault-free run wrote "
                     f"{reference_count}")
    return found


def _mentions(states: Mapping[str, Mapping[str, Any]]) -> str:
    """Every state as JSON text, for finding the blob keys they name."""
    return json.dumps({e: {p: to_jsonable(s) for p, s in by.items()}
                       for e, by in states.items()}, default=str)


@dataclass(frozen=True)
class Judged:
    """What the verdict on a run reads: the campaign's settings (its database, broker and
    bucket), service, consuming endpoints (`queues`), pool, third-party API providers and
    workload, and the run's messages and fault-free runs."""

    settings: Settings
    service: Service
    queues: Sequence[str]
    pool: asyncpg.Pool
    providers: Mapping[str, FakeProvider]
    workload: Workload
    messages: Sequence[OutsideMessage]
    expected: Expected


async def check_run(judged: Judged, log_dir: Path, result: EngineRun) -> None:
    """Every check of a stopped, swept run (docs/fault-injection.md, "eo chaos for your
    service"), its violations added to `result.violations`, with what it found (dead
    letters, blobs, API executions, what is kept at rest) in `result`."""
    settings, service, queues, pool = judged.settings, judged.service, judged.queues, judged.pool
    violations = result.violations
    records = read_logs(log_dir)
    violations += audit_logs(records).violations
    deaths = [read_logs(path.parent, path.name) for path in result.planned_deaths]
    violations += [f"re-run: {v}" for v in rerun_violations(records, deaths)]
    received = {str(r.get("message_id")) for r in records if r.get("event") == MESSAGE_RECEIVED}
    sent = {str(r.get("key")) for r in records
            if r.get("event") == SIDE_EFFECT_PUBLISHED and r.get("kind") == "message"}
    violations += [f"delivery: message {m} was sent and never received"
                   for m in sorted(sent - received)][:10]
    left = await at_rest(pool)
    violations += [f"I8/I9: {n} {name} left at rest" for name, n in left.items() if n]
    result.kept = await kept_at_rest(pool)
    dead = await dead_letters(settings.amqp_urls(), list(queues), database_dsn=settings.database())
    result.dead_letters = dead.total
    committed = committed_in(records, queues)
    violations += await unaccounted(pool, records, committed, queues, judged.messages)
    states = await business_states(service, pool)
    async with bucket_client(settings) as client:
        blobs = await S3BlobStore(client, settings.bucket()).keys()
    result.blobs = len(blobs)
    violations += blob_findings(blobs, _mentions(states), None)
    executions: dict[str, dict[str, int]] = {}
    for api, provider in judged.providers.items():
        stats = await asyncio.to_thread(provider.stats)
        executions[api] = {str(k): int(v) for k, v in stats["executions"].items()}
        result.api_executions += sum(executions[api].values())
        violations += [f"API {api}: key {k} executed {n} times"
                       for k, n in executions[api].items() if n > 1][:10]
    found = observed(queues, Counter(e for e, _ in committed), dead.reasons, states,
                     len(blobs), executions)
    violations += judged.expected.differences(found)
    check = getattr(judged.workload, "check", None)
    if isinstance(judged.workload, FileWorkload) and judged.workload.domain_check is None:
        check = None  # a file without --check
    if check is not None and not result.scenario:  # a fence's two messages are no draw
        outcome = RunOutcome(states, blobs, executions, judged.messages)
        violations += [f"domain: {v}" for v in check(outcome)]
        result.domain_checked = True


async def unaccounted(pool: asyncpg.Pool, records: Sequence[Mapping[str, Any]],
                      committed: set[tuple[str, str]], endpoints: Iterable[str],
                      published: Iterable[OutsideMessage] = ()) -> list[str]:
    """Messages a consuming endpoint of `endpoints` received (`message.received` in the logs
    `records`; a callee's requests have their own checks), or that were `published` to it
    from outside, that it
    neither committed (`committed`: (endpoint, message ID) with commit evidence in the logs,
    or a processed-message row) nor dead-lettered (a `message.dead_lettered` event, or an
    entry in the dead-letter store): lost, whatever the order of the run. At most 10."""
    consuming = set(endpoints)
    received = {(str(r.get("endpoint")), str(r.get("message_id"))) for r in records
                if r.get("event") == MESSAGE_RECEIVED and r.get("endpoint") in consuming}
    received |= {(m.queue, m.message_id) for m in published}
    ended = set(committed) | {(str(r.get("endpoint")), str(r.get("message_id")))
                              for r in records if r.get("event") == MESSAGE_DEAD_LETTERED}
    rows = await pool.fetch(
        "SELECT endpoint, message_id::text AS m FROM eo_processed_message UNION "
        "SELECT endpoint, coalesce(message_id::text, raw_message_id) FROM eo_dead_letter")
    ended |= {(str(r["endpoint"]), str(r["m"])) for r in rows}
    lost = sorted(received - ended)
    return [f"lost: message {m} reached {e} and was neither committed nor dead-lettered there"
            for e, m in lost[:10]] + ([f"lost: ... {len(lost) - 10} more"]
                                      if len(lost) > 10 else [])
