"""`eo chaos`: a randomized fault campaign on the TPC-H sample with real processes.

Each run takes a few random orders of the sample (TPC-H sf=0.001), starts the service as
processes (`eo serve --endpoint payments`, one gateway, two orders consumers, one ledger
consumer) on PostgreSQL, RabbitMQ, one moto S3 server and one carrier (the orders' third-party
API: a fake provider process with Stripe-like idempotency keys, tools/fake_provider.py), and
injects faults:

- failpoints (protocol 10) in the processes' `EO_FAILPOINTS`: `crash` (the process exits at
  once; the campaign restarts it, as an orchestrator would, without the failpoint), `raise`,
  `sleep:<ms>` and `drop_conn` (the broker connection closes, deliveries are requeued);
- `kill -9` of a random process at a random point of progress, then a restart;
- the broker closes every connection of the campaign's virtual host (as a broker restart or a
  network blip would) at random points of progress; each process must reconnect and consume
  again by itself, and the longest time a work queue had no consumer is reported;
- duplicates: copies published at once (concurrent copies), copies published late, and after
  quiescence copies of processed commands re-published (long after: the gateway's inbox
  rows drop them);
- out-of-order input: the commands of all orders are shuffled;
- the carrier answers some requests 503 and takes its time (protocol 12's retries with the
  same key, and copies of a follow-up meeting 409 on the other orders process).

The campaign runs on a database and a virtual host of its own (tools/scratch.py),
created at its start and removed at its end; it never touches what it did not create.

Then quiescence (queues empty, no committed transaction left unfinished, no progress), a
graceful stop, the final sweep, and the checks: the sample's oracle on the
run's orders (tools/tpch/oracle.py: each confirmed order's shipment booked, the carrier's
executions one per confirmed order, each idempotency key executed once), I1/I2/I7 from the
processes' logs, nothing
left at rest (I8, I9), no dead letter and every order settled (I10; the fault budget per run is
bounded and every rule fires at most twice, below the attempt limit).

The fault plan of a run is a pure function of (seed, run index): `--seed N` replays the same
plans and `--seed N --run K` replays run K alone. The processes' timing is not replayed (they
are real processes); the plan is printed with each run so a violation can be reproduced.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
from pydantic import SecretStr

from adapters.postgres.pool import create_pool
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import RabbitDispatcher
from adapters.s3.blob_store import S3BlobStore
from adapters.s3.moto_server import MotoServer
from application.codec import encode
from application.envelope import Envelope
from application.failpoints import NAMES
from application.observability import FAULT_INJECTED
from domain.sample.orders import CARRIER
from entrypoints.faults import CRASH_EXIT
from entrypoints.operations import migrate_all
from entrypoints.settings import ApiSettings, Service, Settings
from tools.chaos.broker import ConsumerGaps, close_all_connections
from tools.chaos.checks import (
    at_rest,
    audit_logs,
    crashed_by_failpoint,
    dead_letters,
    queue_depth,
    read_logs,
    rerun_violations,
)
from tools.chaos.engine import (
    CALLEE_POINTS,
    STATE_POINTS,
    RunTotals,
    failpoint_rule,
    plan_rng,
)
from tools.chaos.fleet import Fleet, bucket_client, business_states, empty_bucket, final_sweep
from tools.demo.local import open_accounts, publish_commands, settled_orders
from tools.demo.run import PAYMENTS
from tools.fake_provider import FakeProvider, fake_provider
from tools.scratch import own_database, own_vhost
from tools.settings import ToolSettings
from tools.tpch.data import TpchSample
from tools.tpch.oracle import check_oracle

#: The campaign's database is `<this>_<pid>_<hex>` (`--database` gives another prefix).
CAMPAIGN_DATABASE = "eo_chaos_campaign"
#: Its virtual host (on a broker this host administers) is `<this>-<pid>-<hex>`.
CAMPAIGN_VHOST = "eo-chaos-campaign"
#: Payments accounts open with TPC-H c_acctbal plus this: low enough that about one order in
#: five of a run is refused.
CAMPAIGN_CREDIT_LIMIT = Decimal("120000")
#: The processes of one run: name -> endpoint.
#: The sample's work queues (the callee, payments, has none).
QUEUES = ("gateway", "orders", "ledger")
PROCESSES: dict[str, str] = {"payments": "payments", "gateway": "gateway",
                             "orders-0": "orders", "orders-1": "orders", "ledger": "ledger"}
#: Failpoints of the consumers (protocol 10) with the suffixes the sample reaches on the
#: co-located path (the default: outgoing messages' tokens are made by the commit, so no
#: `after_register:message`): blob and HTTP-request kinds, first and second publication.
CONSUMER_POINTS: tuple[str, ...] = (
    *sorted(n for n in NAMES if not n.startswith("callee.") and n not in STATE_POINTS),
    "after_register:blob", "after_register:http_request",
    "after_create:blob", "after_create:http_request",
    "after_publish:1", "after_publish:2",
)
#: The HTTP caller's points fire in the orders processes only (the sample's HTTP caller).
HTTP_CALLER_POINTS = frozenset({"after_put", "after_post", "before_delete", "after_delete",
                                "after_register:http_request", "after_create:http_request",
                                "after_api_call"})
#: Points each endpoint's processes reach: the gateway (outbox path) loads no token, makes
#: neither blobs nor HTTP calls and publishes one message per command; the ledger sends
#: nothing.
POINTS: dict[str, tuple[str, ...]] = {
    "orders": CONSUMER_POINTS,
    "gateway": tuple(p for p in CONSUMER_POINTS if p not in HTTP_CALLER_POINTS
                     and p not in ("after_token_load", "after_register:blob",
                                   "after_create:blob", "after_publish:2")),
    "ledger": tuple(p for p in CONSUMER_POINTS if p not in HTTP_CALLER_POINTS
                    and not p.startswith(("after_register:", "after_create:",
                                          "after_publish:"))),
    "payments": CALLEE_POINTS,
}
TABLES = ("eo_token", "eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
          "eo_processed_message", "eo_stored_reply", "eo_http_request", "eo_http_tombstone",
          "eo_state_entry", "eo_inbox")
TRUNCATE = "TRUNCATE " + ", ".join(TABLES)


@dataclass(frozen=True)
class RunPlan:
    """The faults of one run, drawn from (seed, run) alone.

    - `orders`: the TPC-H order keys of the run;
    - `failpoints`: process name -> `EO_FAILPOINTS` of its first start ("" for none);
    - `kills`: (settled orders reached, process name) at which the process gets SIGKILL;
    - `duplicate_rate`: share of commands published twice (half at once, half late);
    - `republish`: commands re-published after quiescence (long-after duplicates);
    - `shuffle_seed`: the publication order of the commands;
    - `broker_closes`: settled orders reached at which the broker closes every connection
      of the campaign's virtual host (drawn from a stream of their own, so adding them left
      every other fault of a (seed, run) as it was);
    - `carrier_failures`, `carrier_latency_s`: the carrier (the sample's third-party API, a
      fake provider process: protocol 12) answers that many requests 503 first, and takes
      that long per booking (their own stream too).
    """

    seed: int
    run: int
    orders: tuple[int, ...]
    failpoints: dict[str, str]
    kills: tuple[tuple[int, str], ...]
    duplicate_rate: float
    republish: int
    shuffle_seed: int
    broker_closes: tuple[int, ...] = ()
    carrier_failures: int = 0
    carrier_latency_s: float = 0.0


def plan_run(seed: int, run: int, order_keys: list[int], orders_per_run: int = 20,
             max_faults: int = 5, broker_closes: bool = True) -> RunPlan:
    """The fault plan of run `run` of campaign `seed`: `orders_per_run` orders drawn from
    `order_keys`, up to `max_faults` failpoint rules and kills, and (with `broker_closes`)
    zero to two broker-side closes of every connection. Deterministic."""
    rng = plan_rng(seed, run)
    orders = tuple(sorted(rng.sample(order_keys, min(orders_per_run, len(order_keys)))))
    failpoints = dict.fromkeys(PROCESSES, "")
    faults = rng.randint(min(2, max_faults), max_faults)
    kills: list[tuple[int, str]] = []
    for _ in range(faults):
        process = rng.choice(list(PROCESSES))
        if rng.random() < 0.3:
            kills.append((rng.randint(0, max(0, len(orders) - 1)), process))
            continue
        endpoint = PROCESSES[process]
        rule = failpoint_rule(rng, POINTS[endpoint], broker=endpoint != "payments")
        if rule.split("=")[0] not in failpoints[process]:  # one rule per name and process
            failpoints[process] = ";".join(filter(None, [failpoints[process], rule]))
    closes: tuple[int, ...] = ()
    if broker_closes:
        other = plan_rng(seed, run, "broker-closes")
        count = other.choices([0, 1, 2], weights=[2, 2, 1])[0]
        closes = tuple(sorted(other.randint(0, max(0, len(orders) - 1)) for _ in range(count)))
    carrier = plan_rng(seed, run, "carrier")
    return RunPlan(seed=seed, run=run, orders=orders, failpoints=failpoints,
                   kills=tuple(sorted(kills)), duplicate_rate=rng.choice([0.1, 0.2, 0.3]),
                   republish=rng.randint(0, 5), shuffle_seed=rng.getrandbits(32),
                   broker_closes=closes, carrier_failures=carrier.choice([0, 0, 1, 3]),
                   carrier_latency_s=carrier.choice([0.0, 0.0, 0.3, 1.0]))


@dataclass
class RunResult:
    """What one run did and found."""

    plan: RunPlan
    seconds: float = 0.0
    deliveries_published: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    confirmed: int = 0
    rejected: int = 0
    #: the longest time each work queue had no consumer while its processes were up
    #: (seconds, sampled every 0.5 s): a broker-side close, a lost or stalled consumer
    consumer_gaps: dict[str, float] = field(default_factory=dict)
    #: the same while one of its processes was down or restarting (a kill or a crash)
    restart_gaps: dict[str, float] = field(default_factory=dict)
    #: the logs of the processes that died by plan (a crash failpoint's exit, a kill -9):
    #: only their attempts in progress excuse a handler re-run
    planned_deaths: list[Path] = field(default_factory=list)
    #: where the run's process logs are kept: the log directory given, or, for a run with
    #: a violation and none given, `KEPT_LOGS`/seed-<s>-run-<k> (a replay may not fail)
    logs: Path | None = None
    #: the carrier's requests answered and bookings executed (one per confirmed order)
    carrier_requests: int = 0
    carrier_executions: int = 0

    @property
    def label(self) -> str:
        """How reports name the run."""
        return f"run {self.plan.run}"


@dataclass
class CampaignReport(RunTotals):
    """Every run's result; `faults` and `violations` summed over runs."""

    seed: int
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def consumer_gaps(self) -> dict[str, float]:
        """The longest time each work queue went without a consumer, over all runs (s)."""
        gaps: dict[str, float] = {}
        for result in self.runs:
            for queue, gap in result.consumer_gaps.items():
                gaps[queue] = max(gaps.get(queue, 0.0), gap)
        return gaps

    def as_json(self) -> dict[str, Any]:
        """The report as JSON-ready data (plans included, for replay)."""
        return {"seed": self.seed, "seconds": round(self.seconds, 1), "runs": len(self.runs),
                "faults": dict(self.faults), "violations": self.violations,
                "consumer_gaps_s": {k: round(v, 2) for k, v in self.consumer_gaps.items()},
                "per_run": [{**asdict(r.plan), "seconds": round(r.seconds, 1),
                             "faults": dict(r.faults), "violations": r.violations,
                             "deliveries_published": r.deliveries_published,
                             "confirmed": r.confirmed, "rejected": r.rejected,
                             "carrier_requests": r.carrier_requests,
                             "carrier_executions": r.carrier_executions,
                             "consumer_gaps_s": {k: round(v, 2)
                                                 for k, v in r.consumer_gaps.items()},
                             "restart_gaps_s": {k: round(v, 2)
                                                for k, v in r.restart_gaps.items()}}
                            for r in self.runs]}


def campaign_settings(base: ToolSettings, blob_dir: Path) -> ToolSettings:
    """`base` with enough attempts that a bounded number of faults never dead-letters. Its
    database and virtual host name the server and broker only: `run_campaign` makes its
    own there."""
    return base.model_copy(update={
        "profile": "local", "token_dsn": None, "blob_dir": blob_dir, "max_attempts": 12,
        # some customers run out of credit: refusals (stored 409s) are exercised too
        "credit_limit": CAMPAIGN_CREDIT_LIMIT,
        # the retry budget (about 45 s) outlasts a killed process's restart on a loaded
        # machine: a dead letter then means a defect, not an outage longer than the budget
        "retry_delays_s": (0.1, 0.5, 1.0, 2.0, 5.0),
        # a committed transaction whose finish was interrupted (a connection lost after the
        # commit) is finished by the sweeper within seconds, well inside a run's quiet period
        "stale_after_s": 2.0,
        # a consumer that stops receiving is re-created before the run is judged stuck
        "consumer_watchdog_s": 5.0})


async def run_campaign(
    settings: ToolSettings,
    service: Service,
    sample: TpchSample,
    seed: int,
    duration_s: float,
    only_run: int | None = None,
    orders_per_run: int = 20,
    log_root: Path | None = None,
    on_run: Callable[[RunResult], None] = lambda _r: None,
    run_timeout_s: float = 240.0,
    database: str = CAMPAIGN_DATABASE,
) -> CampaignReport:
    """Runs until `duration_s` has passed (at least one run), or only run `only_run`.

    `settings`: from `campaign_settings`. The campaign creates a database
    `<database>_<pid>_<hex>` on the server of `settings.database()` and, when this host
    administers the broker, a virtual host `eo-chaos-campaign-<pid>-<hex>` (else it uses the
    URL's own, when that holds none of the sample's queues), and removes them at the end
    (tools/scratch.py). Broker-side closes need that virtual host of its own: they hit
    every connection of the virtual host. Each run's logs go to `log_root/run-<k>` (a temp
    directory, removed afterwards, when `log_root` is None). Raises `SettingsError` naming
    `EO_AMQP_URL` when the URL's virtual host would have to be used and holds the sample's
    queues, and what the services raise when they are unreachable; violations are
    reported, not raised.
    """
    started = time.monotonic()
    report = CampaignReport(seed=seed)
    async with own_vhost(settings.amqp(), CAMPAIGN_VHOST, QUEUES, len(settings.retry_delays_s),
                         "eo chaos") as broker, \
            own_database(settings.database(), database) as dsn:
        settings = settings.model_copy(update={"amqp_url": SecretStr(broker.url),
                                               "database_dsn": SecretStr(dsn)})
        await _campaign(settings, service, sample, seed, duration_s, only_run, orders_per_run,
                        log_root, on_run, run_timeout_s, broker.vhost is not None, report)
    report.seconds = time.monotonic() - started
    return report


#: where a run with a violation keeps its process logs when no log directory was given
KEPT_LOGS = Path("var/chaos")


async def _campaign(settings: ToolSettings, service: Service, sample: TpchSample, seed: int,
                    duration_s: float, only_run: int | None, orders_per_run: int,
                    log_root: Path | None, on_run: Callable[[RunResult], None],
                    run_timeout_s: float, closes: bool, report: CampaignReport) -> None:
    """`run_campaign`'s runs, into `report`, on the stores `settings` name (its own)."""
    started = time.monotonic()
    moto = MotoServer()
    temp = None if log_root is not None else Path(tempfile.mkdtemp(prefix="eo-chaos-"))
    root = log_root or temp
    assert root is not None
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    stack = contextlib.ExitStack()
    carrier = stack.enter_context(fake_provider(root / "carrier.log"))
    settings = settings.model_copy(update={
        "s3_endpoint_url": moto.start(), "s3_access_key": SecretStr("local"),
        "s3_secret_key": SecretStr("local"),
        "apis": {**settings.apis, CARRIER: ApiSettings.model_validate({"url": carrier.url})}})
    try:
        await migrate_all(settings)  # the campaign's own database, new
        pool = await create_pool(settings.database(), max_size=2)
        try:
            keys = sorted(sample.expected)
            runs = [only_run] if only_run is not None else None
            k = 0
            while True:
                index = runs[0] if runs else k
                plan = plan_run(seed, index, keys, orders_per_run, broker_closes=closes)
                result = await _one_run(settings, service, sample, plan, pool,
                                        root / f"run-{index}",
                                        run_timeout_s, carrier)
                result.logs = root / f"run-{index}" if temp is None else None
                if result.violations and temp is not None:  # a timing may not come again
                    kept = KEPT_LOGS / f"seed-{seed}-run-{index}"
                    await asyncio.to_thread(shutil.copytree, root / f"run-{index}", kept,
                                            dirs_exist_ok=True)
                    result.logs = kept
                report.runs.append(result)
                on_run(result)
                k += 1
                if runs or time.monotonic() - started >= duration_s:
                    break
        finally:
            await pool.close()
    finally:
        moto.stop()
        stack.close()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


async def _prepare(settings: ToolSettings, service: Service, pool: asyncpg.Pool,
                   sample: TpchSample) -> None:
    # the campaign's own database and bucket; the queues go at the end of each run
    await pool.execute(TRUNCATE)
    await open_accounts(pool, service, sample, settings.credit_limit)
    await empty_bucket(settings)


async def _one_run(settings: ToolSettings, service: Service, full: TpchSample, plan: RunPlan,
                   pool: asyncpg.Pool,
                   log_dir: Path, timeout_s: float, carrier: FakeProvider) -> RunResult:
    started = time.monotonic()
    result = RunResult(plan=plan)
    sample = full.subset(plan.orders)
    await _prepare(settings, service, pool, sample)
    await asyncio.to_thread(carrier.reset)  # this run's keys and counts only
    await asyncio.to_thread(carrier.faults, plan.carrier_failures, plan.carrier_latency_s)
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    fleet = Fleet(settings, log_dir, 0.0, extra_env={
        "EO_MAX_ATTEMPTS": str(settings.max_attempts),
        "EO_RETRY_DELAYS_S": json.dumps(list(settings.retry_delays_s)),
        "EO_STALE_AFTER_S": str(settings.stale_after_s),
        "EO_CONSUMER_WATCHDOG_S": str(settings.consumer_watchdog_s),
        # the consumers batch as `eo chaos` was told to (EO_BATCH_SIZE, docs/batching.md)
        "EO_BATCH_SIZE": str(settings.batch_size),
        "EO_BATCH_WAIT_MS": str(settings.batch_wait_ms),
        **({} if settings.prefetch is None else {"EO_PREFETCH": str(settings.prefetch)})})
    rabbit = RabbitConnection(settings.amqp())
    await rabbit.start()
    for endpoint in QUEUES:
        await topology.declare(rabbit, endpoint, settings.retry_delays_s,
                               settings.delivery_limit)
    faults: Counter[str] = Counter()
    faults["carrier 503 (injected)"] += plan.carrier_failures
    if plan.carrier_latency_s:
        faults["carrier slow (latency injected)"] += 1
    try:
        fleet.start(PAYMENTS, PAYMENTS, {"EO_FAILPOINTS": plan.failpoints[PAYMENTS]})
        await fleet.wait_for_callee(PAYMENTS)
        for name, endpoint in PROCESSES.items():
            if name != "payments":
                fleet.start(name, endpoint, {"EO_FAILPOINTS": plan.failpoints[name]})
        rng = random.Random(plan.shuffle_seed)
        copies = await publish_commands(rabbit, sample, plan.duplicate_rate, rng)
        result.deliveries_published = len(sample.commands) + copies
        faults["duplicate (published twice)"] += copies
        faults["out-of-order input (commands shuffled)"] += len(sample.commands)
        kills = list(plan.kills)
        marks = Marks(kills, list(plan.broker_closes))
        gaps = ConsumerGaps()
        settled = await _quiesce(settings, fleet, pool, rabbit, len(sample.expected), marks,
                                 faults, gaps, timeout_s, started, result)
        if settled < len(sample.expected):
            result.violations.append(
                f"I10: {settled} of {len(sample.expected)} orders settled when the system "
                f"went quiet (or after {timeout_s:.0f} s)")
        elif plan.republish:
            late = rng.sample(list(sample.commands), min(plan.republish, len(sample.commands)))
            dispatcher = RabbitDispatcher(rabbit)
            await asyncio.gather(*(dispatcher.dispatch("gateway", Envelope(
                c.message_id, type(c.message).__name__, encode(c.message))) for c in late))
            faults["duplicate (re-published after processing)"] += len(late)
            result.deliveries_published += len(late)
            await _quiesce(settings, fleet, pool, rabbit, len(sample.expected), Marks(),
                           faults, gaps, timeout_s, time.monotonic(), result)
        gaps.finish()
        result.consumer_gaps = gaps.longest_s
        result.restart_gaps = gaps.while_restarting_s
        codes = fleet.stop_all(keep=(PAYMENTS,))
        await final_sweep(fleet.caller_settings(settings), service)
        # 0: a graceful stop; -SIGTERM: still starting up (no handler yet), nothing to lose
        result.violations += [f"{n} exited {c} on SIGTERM" for n, c in codes.items()
                              if c not in (0, -signal.SIGTERM)]
    finally:
        fleet.stop_all()
        await rabbit.close()
    await _check(settings, service, sample, pool, log_dir, result, carrier)
    # the run declared them (on the campaign's own virtual host, or on the URL's, where
    # there were none): the next run starts from nothing
    await topology.delete_queues(settings.amqp(), list(QUEUES), len(settings.retry_delays_s))
    for record in read_logs(log_dir):
        if record.get("event") == FAULT_INJECTED:
            faults[f"failpoint {str(record.get('action', '')).split(':')[0]}"] += 1
    result.faults = faults
    result.seconds = time.monotonic() - started
    return result


@dataclass
class Marks:
    """The plan's progress marks still to come: kills (settled orders, process) and
    broker-side closes (settled orders)."""

    kills: list[tuple[int, str]] = field(default_factory=list)
    closes: list[int] = field(default_factory=list)


async def _quiesce(settings: Settings, fleet: Fleet, pool: asyncpg.Pool,
                   rabbit: RabbitConnection, orders: int, marks: Marks, faults: Counter[str],
                   gaps: ConsumerGaps, timeout_s: float, started: float,
                   result: RunResult) -> int:
    """Until the system is quiet: the work and retry queues empty, no committed transaction
    left unfinished, and no order settled for 2 polls when all are settled (30 when not:
    dead letters or a stuck order, which the checks then name), or the timeout. Restarts
    processes that exited (a `crash` failpoint) without their failpoints, SIGKILLs (then
    restarts) processes and has the broker close every connection when the plan's progress
    marks are reached, and samples each work queue's consumer count into `gaps`. Unplanned
    exits go to `result.violations`, the logs of planned deaths to `result.planned_deaths`."""
    idle, last, settled = 0, -1, 0
    while time.monotonic() - started < timeout_s:
        await asyncio.sleep(0.5)
        await gaps.observe(rabbit, QUEUES, {PROCESSES[name] for name in fleet.procs
                                              if not _consuming(fleet, name)})
        for name, proc in fleet.procs.items():
            if proc.poll() is not None:
                if proc.returncode == CRASH_EXIT and crashed_by_failpoint(_log_of(fleet, name)):
                    faults["process exit (crash failpoint)"] += 1
                    result.planned_deaths.append(_log_of(fleet, name))
                else:  # anything but the failpoint's exit is the service's own failure
                    result.violations.append(
                        f"{name} exited with {proc.returncode} during the run")
                fleet.start(name, PROCESSES[name], {"EO_FAILPOINTS": ""})
                if name == "payments":
                    await fleet.wait_for_callee(PAYMENTS)
        settled = await settled_orders(pool)
        while marks.kills and marks.kills[0][0] <= settled:
            _, name = marks.kills.pop(0)
            result.planned_deaths.append(_log_of(fleet, name))
            fleet.kill(name)
            faults["kill -9"] += 1
            fleet.start(name, PROCESSES[name], {"EO_FAILPOINTS": ""})
            if name == "payments":
                await fleet.wait_for_callee(PAYMENTS)
        while marks.closes and marks.closes[0] <= settled:
            marks.closes.pop(0)
            await asyncio.to_thread(close_all_connections, settings.amqp())
            faults["broker closed every connection"] += 1
        busy = await queue_depth(settings.amqp(), list(QUEUES), len(settings.retry_delays_s))
        # a committed transaction not finished yet (its finish was interrupted) is work in
        # progress: the sweeper finishes it after `stale_after_s`
        busy += int(await pool.fetchval(
            "SELECT count(*) FROM eo_transaction_record WHERE message_id IS NOT NULL"))
        idle = idle + 1 if busy == 0 and settled == last else 0
        last = settled
        # quiet for 1 s with every order settled, or for 15 s without (dead letters, a
        # stuck order: the checks then say what is wrong)
        if idle >= (2 if settled >= orders else 30):
            break
    return settled


def _log_of(fleet: Fleet, name: str) -> Path:
    """The log of process `name`'s current start."""
    return fleet.log_dir / f"{name}.{fleet.starts[name]}.jsonl"


def _consuming(fleet: Fleet, name: str) -> bool:
    """Whether process `name` runs and its current start logged `consumer.started` (the
    callee, which consumes no queue, counts as consuming while it runs)."""
    proc = fleet.procs[name]
    if proc.poll() is not None:
        return False
    if name == "payments":
        return True
    log = _log_of(fleet, name)
    try:
        with log.open("rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    return b'"consumer.started"' in head


async def _check(settings: ToolSettings, service: Service, sample: TpchSample,
                 pool: asyncpg.Pool, log_dir: Path,
                 result: RunResult, carrier: FakeProvider) -> None:
    states = await business_states(service, pool)
    async with bucket_client(settings) as client:
        blobs = await S3BlobStore(client, settings.bucket()).keys()
    booked = await asyncio.to_thread(carrier.stats)
    result.carrier_requests = int(booked["requests"])
    result.carrier_executions = sum(booked["executions"].values())
    oracle = check_oracle(sample, states["orders"], states["ledger"], states[PAYMENTS],
                          blobs, settings.credit_limit, booked["executions"])
    result.confirmed, result.rejected = oracle.confirmed, oracle.rejected
    result.violations += [f"oracle: {v}" for v in oracle.violations]
    records = read_logs(log_dir)
    result.violations += audit_logs(records).violations
    deaths = [read_logs(path.parent, path.name) for path in result.planned_deaths]
    result.violations += [f"re-run: {v}" for v in rerun_violations(records, deaths)]
    left = await at_rest(pool)
    result.violations += [f"I8/I9: {n} {name} left at rest" for name, n in left.items() if n]
    dead = await dead_letters(settings.amqp(), list(QUEUES), database_dsn=settings.database())
    for endpoint, reasons in dead.reasons.items():
        result.violations += [f"I10: {endpoint} dead-lettered a message: {r}" for r in reasons]
