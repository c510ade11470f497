"""A service made from the template's previous release taken to this tree with messages in
flight (docs/upgrading.md): made by `copier copy --vcs-ref v<previous>` with the fixture's
endpoints, run on PostgreSQL and RabbitMQ and killed (-9) while its messages are half
processed; `copier update` to this tree (no conflict); `eo migrate`; one worker of the old
release beside one of the new for a while, then the new ones alone. Every parcel is shipped
and tracked once, and nothing stays at rest: no token, no unfinished transaction record, no
side-effect record, no inbox row waiting, no dead letter.

Finds the previous release by its tag, or by its changelog entry's history in a clone
without tags; `EO_TEST_UPGRADE_FROM=<git ref>` rehearses the upgrade of a service made
from another commit of the template (docs/upgrading.md). Slow (two new
environments): `pytest -m template` runs it with the rest of the template's tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aio_pika
import asyncpg
import pytest

from adapters.postgres.admin import drop_database, with_database
from adapters.s3.moto_server import MotoServer
from tests.support.processes import delete_vhost, private_vhost, this_run
from tests.support.services import discover
from tests.template.test_instantiation import (
    ROOT,
    add_endpoints,
    clean_env,
    copier,
    run,
    stop,
)

pytestmark = [pytest.mark.template, pytest.mark.slow(minutes=3)]

PARCELS = 40  # each to one of four destinations (tracking's partitions)
DESTINATIONS = ("lyon", "paris", "lille", "brest")


def previous_release() -> str:
    """The previous release as a git ref: its tag `v<version>` when this checkout has it,
    else the commit that dated its changelog entry (the release commit, docs/upgrading.md:
    a clone or a mirror that came without tags still knows its releases). The newest
    release in docs/changelog.md whose commit is not HEAD itself."""
    head = run(["git", "rev-parse", "HEAD"], ROOT).stdout.strip()
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    for version in re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", changelog,
                              re.MULTILINE):
        tagged = run(["git", "rev-parse", "-q", "--verify", f"refs/tags/v{version}^{{commit}}"],
                     ROOT, check=False).stdout.strip()
        if tagged:
            ref, target = f"v{version}", tagged
        else:
            dated = run(["git", "log", "--reverse", "--format=%H", "-G",
                         rf"^## {re.escape(version)} \([0-9]{{4}}-", "--", "docs/changelog.md"],
                        ROOT).stdout.split()
            if not dated:
                continue
            ref = target = dated[0]
        if target != head:
            return ref
    pytest.fail("no release before HEAD in docs/changelog.md with a tag or a dated entry in "
                "this checkout's history")


def commit(project: Path, message: str) -> None:
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm",
         message], project)


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A service made from the previous release with the fixture's endpoints, committed."""
    tag = os.environ.get("EO_TEST_UPGRADE_FROM") or previous_release()
    made = tmp_path_factory.mktemp("released")
    project = made / "parcel-service"
    copier("copy", "--vcs-ref", tag, "--defaults", "--data", "service_name=parcel-service",
           "--data", "keep_sample=false", str(ROOT), str(project))
    add_endpoints(project)
    # as a team does after registering its endpoints (their Kubernetes objects); the first
    # ./dev also locks the environment under the service's name
    run(["./dev", "manifests"], project, env=clean_env())
    run(["git", "init", "-q"], project)
    commit(project, f"made from the template {tag}")
    return tag, project


def ships(parcels: range) -> list[tuple[str, dict[str, object]]]:
    return [(str(uuid.uuid5(uuid.NAMESPACE_URL, f"upgrade/{n}")),
             {"parcel": f"u-{n}", "grams": 100 + n,
              "destination": DESTINATIONS[n % len(DESTINATIONS)]}) for n in parcels]


async def publish(url: str, messages: list[tuple[str, dict[str, object]]]) -> None:
    """The outside producer's wire format (docs/examples/publish.py), one connection."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        for message_id, body in messages:
            await channel.default_exchange.publish(
                aio_pika.Message(json.dumps(body).encode(), message_id=message_id,
                                 type="Ship", content_type="application/json",
                                 user_id=unquote(urlsplit(url).username or "") or "guest",
                                 delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key="parcels", mandatory=True)


async def tracked(dsn: str) -> list[str]:
    """Every parcel in tracking's states (a parcel tracked twice is listed twice)."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT state FROM eo_transaction_record "
                                "WHERE endpoint = 'tracking' AND state IS NOT NULL")
    finally:
        await conn.close()
    return [p for r in rows for p in json.loads(r["state"])["parcels"]]


async def at_rest(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {table: int(await conn.fetchval(f"SELECT count(*) FROM {table}{where}"))
                for table, where in (
                    ("eo_token", ""), ("eo_side_effect_record", ""),
                    ("eo_transaction_record", " WHERE message_id IS NOT NULL"),
                    ("eo_inbox", " WHERE relayed_at IS NULL"), ("eo_dead_letter", ""))}
    finally:
        await conn.close()


class Workers:
    """Consumer processes of the service's trees, each logging to its own file."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, tree: Path, endpoint: str) -> None:
        with (self.logs / f"{name}.jsonl").open("wb") as out:
            # a session of its own: `uv run` under ./dev is the consumer's parent, and a
            # kill -9 must reach the consumer itself
            self.procs[name] = subprocess.Popen(
                ["./dev", "consume", "--endpoint", endpoint], cwd=tree, env=self.env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180  # the first start of a tree makes its environment
        while '"consumer.started"' not in self.log(name):
            assert self.procs[name].poll() is None, self.log(name)[-4000:]
            assert time.monotonic() < deadline, f"{name} did not start"
            time.sleep(0.2)

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.jsonl").read_text(errors="replace")

    def events(self, event: str) -> Counter[str]:
        """How many `event`s each worker logged."""
        return Counter({name: self.log(name).count(f'"event": "{event}"')
                        for name in self.procs})

    def kill(self) -> None:
        """kill -9 every worker still running, its consumer process with it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def stop(self, *names: str) -> None:
        stop([self.procs[n] for n in names])
        for name in names:
            assert self.procs[name].returncode == 0, self.log(name)[-4000:]


def wait_for(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def test_a_service_of_the_previous_release_upgrades_with_messages_in_flight(
        released: tuple[str, Path], tmp_path: Path) -> None:
    tag, project = released
    services = discover()
    moto = MotoServer()
    env = clean_env(EO_PROFILE="local",
                    EO_DATABASE_DSN=with_database(services.postgres_dsn, this_run("eo_upgrade")),
                    EO_AMQP_URL=private_vhost(services.amqp_url, this_run("eo-upgrade", "-")),
                    EO_BLOB_STORE="s3", EO_S3_ENDPOINT_URL=moto.start(),
                    EO_S3_BUCKET="parcel-labels", EO_S3_ACCESS_KEY="local",
                    EO_S3_SECRET_KEY="local", AWS_EC2_METADATA_DISABLED="true",
                    EO_SWEEP_INTERVAL_S="0.5")
    dsn, url = env["EO_DATABASE_DSN"], env["EO_AMQP_URL"]
    workers = Workers(env, tmp_path / "logs")
    old_tree = tmp_path / "old"
    try:
        # the previous release at work, killed with its messages half processed
        run(["./dev", "migrate"], project, env=env)
        workers.start("old-parcels", project, "parcels")
        workers.start("old-tracking", project, "tracking")
        asyncio.run(publish(url, ships(range(PARCELS))))
        wait_for(lambda: len(asyncio.run(tracked(dsn))) >= PARCELS // 4, 60,
                 "the old release tracked nothing")
        workers.kill()
        left = asyncio.run(at_rest(dsn))
        print(f"\nkilled the {tag} workers with {len(asyncio.run(tracked(dsn)))} of {PARCELS} "
              f"parcels tracked; at rest then: {left}")
        # the old tree kept beside (an old worker during the roll-out), then the update
        run(["git", "worktree", "add", "-q", str(old_tree), "HEAD"], project)
        done = copier("update", "--vcs-ref", "HEAD", "--defaults", "--conflict", "inline",
                      cwd=project)
        status = run(["git", "status", "--porcelain"], project).stdout
        conflicted = [line for line in status.splitlines() if line[:2] in ("UU", "AA")]
        marked = run(["git", "grep", "-l", "-e", "^<<<<<<< ", "--", "."], project,
                     check=False).stdout.split()
        assert conflicted == marked == [], (status, marked, done.stderr[-3000:])
        commit(project, "copier update to the template's HEAD")
        migrated = run(["./dev", "migrate"], project, env=env).stdout
        print(f"\n./dev migrate after copier update {tag} -> HEAD: {migrated.strip()}")
        # the roll-out: an old worker beside a new one, then the new ones alone
        workers.start("old-parcels-2", old_tree, "parcels")
        workers.start("new-parcels", project, "parcels")
        workers.start("new-tracking", project, "tracking")
        asyncio.run(publish(url, ships(range(PARCELS, PARCELS + PARCELS // 2))))
        wait_for(lambda: len(asyncio.run(tracked(dsn))) >= PARCELS, 90,
                 "the roll-out tracked too little")
        workers.stop("old-parcels-2")
        asyncio.run(publish(url, ships(range(PARCELS + PARCELS // 2, 2 * PARCELS))))
        wait_for(lambda: len(asyncio.run(tracked(dsn))) >= 2 * PARCELS
                 and not any(asyncio.run(at_rest(dsn)).values()), 90,
                 "the new release did not finish")
        time.sleep(1)  # a doubled commit would land now
        workers.stop("new-parcels", "new-tracking")
        parcels = asyncio.run(tracked(dsn))
        rest = asyncio.run(at_rest(dsn))
        commits = workers.events("transaction.committed")
        print(f"\nroll-out {tag} -> HEAD: commits per worker {dict(commits)}, duplicates "
              f"dropped {dict(workers.events('message.duplicate'))}, at rest {rest}")
        assert sorted(parcels) == sorted(f"u-{n}" for n in range(2 * PARCELS))  # each once
        assert not any(rest.values()), rest
        # side by side, each release's worker took its share
        assert commits["old-parcels-2"] > 0
        assert commits["new-parcels"] > 0
    finally:
        workers.kill()
        asyncio.run(drop_database(dsn))
        delete_vhost(url)
        moto.stop()
        services.close()
        if old_tree.exists():
            run(["git", "worktree", "remove", "--force", str(old_tree)], project, check=False)
