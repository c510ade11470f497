"""The service's image, as an operator runs it (issue 26): built by `deploy/image/check` with
podman, which then runs this module with `EO_TEST_IMAGE` naming it (skipped otherwise).

What a team deploying the image relies on: it lists the registry's endpoints, runs as a
non-root user, carries OCI labels and a health check, migrates an empty database, starts
every registered endpoint (consumers and gateways with `consume`, HTTP callees with `serve`)
against PostgreSQL, RabbitMQ and an S3 API until each answers `/ready` (or `/health`), passes
its health check, and stops with status 0 on SIGTERM; and a missing S3 API in the local
profile stops start-up with a message naming the settings, not a traceback. Every container
runs on a database and a virtual host of this module's own, on the host's network.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from adapters.postgres.admin import drop_database, ensure_database, with_database
from adapters.postgres.migrate import head_revision
from application.registry import Role
from entrypoints.version import TEMPLATE_VERSION
from service.registry import REGISTRY
from tests.support.image import (
    IMAGE,
    ImageFleet,
    image_fleet,
    needs_image,
    podman,
    run_image,
    s3_api,
)
from tests.support.processes import Proc, Where, calling, delete_vhost, private_vhost, this_run
from tests.support.services import discover

pytestmark = [needs_image, pytest.mark.slow]  # containers

CALLEE_TOKEN = "image-check-callee-token"
#: the settings of every container of this module, over `Fleet.env`'s
SETTINGS = {"EO_BLOB_STORE": "s3", "EO_S3_ACCESS_KEY": "local", "EO_S3_SECRET_KEY": "local",
            "EO_POOL_SIZE": "2"}


def free_port() -> int:
    """A port no one listens on now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    """An empty database (the image migrates it) and a virtual host of this module's own."""
    services = discover()
    try:
        dsn = with_database(services.postgres_dsn, this_run("eo_image"))
        asyncio.run(drop_database(dsn))
        asyncio.run(ensure_database(dsn))
        url = private_vhost(services.amqp_url, this_run("eo-image", "-"))
        try:
            yield Where(dsn, url)
        finally:
            delete_vhost(url)
            asyncio.run(drop_database(dsn))
    finally:
        services.close()


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    with s3_api() as url:
        yield url


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[ImageFleet]:
    async with image_fleet(where, tmp_path) as started:
        yield started


def test_the_image_lists_the_registry_s_endpoints() -> None:
    assert IMAGE is not None
    listed = run_image(IMAGE, "endpoints")
    assert listed.returncode == 0, listed.stderr
    for registration in REGISTRY:
        assert registration.name in listed.stdout, listed.stdout


def test_the_image_runs_as_a_user_that_is_not_root() -> None:
    assert IMAGE is not None
    user = run_image(IMAGE, "-u", entrypoint="id")
    assert user.returncode == 0, user.stderr
    assert user.stdout.strip() == "10001"


def test_the_image_carries_oci_labels_and_a_health_check() -> None:
    assert IMAGE is not None
    inspected = podman("image", "inspect", IMAGE)
    assert inspected.returncode == 0, inspected.stderr
    [config] = json.loads(inspected.stdout)
    labels = config["Config"]["Labels"]
    for name in ("title", "version", "revision", "licenses", "base.name"):
        assert labels.get(f"org.opencontainers.image.{name}"), (name, labels)
    assert labels["org.opencontainers.image.revision"] != "unknown"  # the build set it
    assert labels["io.exactly-once.template.version"] == TEMPLATE_VERSION
    assert "/health" in " ".join(config["Healthcheck"]["Test"])


async def test_migrate_then_every_endpoint_is_ready_healthy_and_stops_on_sigterm(
        fleet: ImageFleet, where: Where, s3: str) -> None:
    assert IMAGE is not None
    migrated = await asyncio.to_thread(run_image, IMAGE, "migrate", env={
        "EO_PROFILE": "local", "EO_DATABASE_DSN": where.dsn})
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    conn = await asyncpg.connect(where.dsn)
    try:
        assert await conn.fetchval("SELECT version_num FROM eo_schema_version") == \
            head_revision()
    finally:
        await conn.close()

    procs: dict[str, Proc] = {}
    for callee in REGISTRY.names(Role.CALLEE):
        procs[callee] = fleet.serve(callee, CALLEE_TOKEN, EO_S3_ENDPOINT_URL=s3, **SETTINGS)
    await fleet.ready(*procs.values(), timeout_s=90)
    checked: Proc | None = None  # the consumer whose HEALTHCHECK runs
    for registration in REGISTRY:
        if registration.role is Role.CALLEE:
            continue
        env: dict[str, str | None] = {"EO_S3_ENDPOINT_URL": s3, **SETTINGS}
        if checked is None:  # on the host's network 9464 may be another's: a port of its own
            env["EO_METRICS_PORT"] = str(free_port())
        for callee in registration.callees:
            url = procs[callee].url
            assert url is not None
            env.update(calling(callee, url, CALLEE_TOKEN))
        procs[registration.name] = fleet.start(registration.name, **env)
        checked = checked or procs[registration.name]
    await fleet.ready(*procs.values(), timeout_s=90)

    if checked is not None:  # the image's HEALTHCHECK, run as the engine runs it
        health = await asyncio.to_thread(podman, "healthcheck", "run",
                                         fleet.container_of(checked))
        assert health.returncode == 0, health.stdout + health.stderr

    for proc in procs.values():
        proc.popen.send_signal(signal.SIGTERM)
    for name, proc in procs.items():
        code = await fleet.exit_code(proc, 60)
        assert code == 0, f"{name} exited with {code} on SIGTERM\n{proc.tail()}"


@pytest.mark.skipif(not any(r.blobs for r in REGISTRY), reason="no endpoint makes blobs")
async def test_the_local_profile_without_an_s3_api_says_which_settings(
        fleet: ImageFleet, where: Where) -> None:
    """The image carries no moto (a development dependency): the local profile without
    `EO_S3_ENDPOINT_URL` cannot start the S3 API it would start on a laptop."""
    migrated = await asyncio.to_thread(run_image, IMAGE or "", "migrate", env={
        "EO_PROFILE": "local", "EO_DATABASE_DSN": where.dsn})
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    [name] = [r.name for r in REGISTRY if r.blobs][:1]
    proc = fleet.start(name, EO_BLOB_STORE=None, EO_S3_ENDPOINT_URL=None)
    code = await fleet.exit_code(proc, 90)
    text = proc.text()
    assert code == 2, f"exit {code}\n{proc.tail()}"
    assert "EO_S3_ENDPOINT_URL" in text
    assert "EO_BLOB_STORE=directory" in text
    assert "Traceback" not in text
