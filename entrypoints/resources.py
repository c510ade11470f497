"""The local and production profiles' resources, each a dependency-injector `Resource` (made on
first use, closed by `shutdown_resources`): the PostgreSQL pools, the broker connection, the
blob store; and the helpers that start, await and stop a container's resources."""

from __future__ import annotations

import importlib.util
import inspect
from collections.abc import AsyncIterator
from typing import Any, TypeVar, cast

from dependency_injector import containers, providers
from yarl import URL

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource
from application.ports import BlobStore
from application.registry import Registry
from entrypoints.settings import Settings, SettingsError


async def blob_resource(settings: Settings, registry: Registry
                        ) -> AsyncIterator[BlobStore | None]:
    """dependency-injector `Resource`: the blob store, None when no endpoint makes blobs.
    S3 at `EO_S3_ENDPOINT_URL`; in the local profile without an endpoint, a moto server this
    process starts (and stops: moto is a development dependency); in production without
    one, AWS. A directory when `EO_BLOB_STORE=directory`. Raises `SettingsError` naming
    `EO_S3_ENDPOINT_URL` when the local profile would start moto and moto is not installed
    (the image has no development dependencies)."""
    if not any(r.blobs for r in registry):
        yield None
        return
    if not settings.blobs_in_s3():
        yield LocalDirectoryBlobStore(settings.blobs.blob_dir)
        return
    moto = None
    blobs = settings.blobs
    endpoint = blobs.s3_endpoint_url
    access = blobs.s3_access_key.get_secret_value() if blobs.s3_access_key else None
    secret = blobs.s3_secret_key.get_secret_value() if blobs.s3_secret_key else None
    if endpoint is None and settings.profile == "local":
        if importlib.util.find_spec("moto") is None:
            raise SettingsError(
                "invalid setting EO_S3_ENDPOINT_URL: unset, so the local profile would start "
                "an S3 API of its own (moto), which is not installed here (a development "
                "dependency: the image has none). Set EO_S3_ENDPOINT_URL to an S3 API "
                "(MinIO, a moto server of its own), or EO_BLOB_STORE=directory")
        from adapters.s3.moto_server import MotoServer

        moto = MotoServer()
        endpoint = moto.start()
        access, secret = access or "local", secret or "local"
    try:
        bucket, owner = settings.bucket(), settings.blobs.s3_expected_bucket_owner
        async with s3_client_resource(endpoint, settings.blobs.s3_region, access, secret) as client:
            # production finds its bucket (a typo must not create a new one); local makes it
            await ensure_bucket(client, bucket, owner, create=settings.profile != "production")
            yield S3BlobStore(client, bucket, expected_owner=owner)
    finally:
        if moto is not None:
            moto.stop()


async def rabbit_resource(settings: Settings, name: str) -> AsyncIterator[RabbitConnection]:
    """dependency-injector `Resource`: a started, supervised connection named `name` (the
    broker shows it), giving up after `EO_BROKER_GIVE_UP_S`; closed on shutdown."""
    connection = RabbitConnection(settings.amqp_urls(),
                                  give_up_after_s=settings.rabbitmq.broker_give_up_s, name=name)
    await connection.start()
    try:
        yield connection
    finally:
        await connection.close()


def broker_user(settings: Settings) -> str:
    """The service's own RabbitMQ user: the AMQP URL's, or `guest` as aio-pika logs in
    without one. The copies the service publishes carry it as `user_id`, which is how a
    source tells them from an outside producer's messages
    (`adapters.rabbitmq.dispatcher.producer_of`)."""
    return URL(settings.amqp()).user or "guest"


T = TypeVar("T")


async def provided(provider: providers.Provider[T]) -> T:
    """What `provider` gives, awaited: a provider that depends on an async resource (the
    pools, the broker connection) returns an awaitable of it, which dependency-injector's
    type stubs cannot tell from the object itself."""
    value: Any = provider()
    if inspect.isawaitable(value):
        value = await value
    return cast(T, value)


async def init_resources(container: containers.Container) -> None:
    """Start `container`'s resources (`Container.init_resources`, awaited when one of them
    is async). Raises what a resource's start raises."""
    started: Any = container.init_resources()
    if inspect.isawaitable(started):
        await started


async def shutdown_resources(container: containers.Container) -> None:
    """Stop `container`'s resources (`Container.shutdown_resources`, awaited when one of
    them is async)."""
    stopped: Any = container.shutdown_resources()
    if inspect.isawaitable(stopped):
        await stopped
