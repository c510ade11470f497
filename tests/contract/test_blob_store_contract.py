"""The `BlobStore` contract, each adapter a subclass (memory, a local directory, S3 on a moto
server): overwrite, idempotent delete, sorted prefix listing, binary content; and the S3
adapter's error translation."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from adapters.localfs.blob_store import LocalDirectoryBlobStore
from adapters.memory.blob_store import MemoryBlobStore
from adapters.s3.blob_store import S3BlobStore, ensure_bucket, s3_client_resource, translated
from adapters.s3.moto_server import MotoServer
from application.errors import PermanentError, TransientError
from application.ports import BlobStore

REGION = "eu-west-1"  # not us-east-1, so bucket creation names a location constraint
SECRET = "contract-secret-key"
PDF = "application/pdf"


@dataclass(frozen=True)
class Harness:
    """A store and a way to read an object back behind it: (content, media type), the media
    type None where the adapter does not keep it (files)."""

    store: BlobStore
    read_back: Callable[[str], Awaitable[tuple[bytes, str | None]]]


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = MotoServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
async def s3_client(moto_endpoint: str) -> AsyncIterator[Any]:
    async with s3_client_resource(moto_endpoint, REGION, "contract", SECRET) as client:
        yield client


async def test_s3_missing_bucket_is_permanent_and_named(s3_client: Any) -> None:
    store = S3BlobStore(s3_client, "no-such-bucket-here")
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.put("k", b"x", PDF), lambda: store.delete("k"), store.keys]
    for call in calls:
        with pytest.raises(PermanentError, match="no-such-bucket-here") as caught:
            await call()
        assert "NoSuchBucket" in caught.value.reason
        assert SECRET not in caught.value.reason


async def test_s3_unreachable_endpoint_is_transient_and_tried_once() -> None:
    """An S3 API that drops every connection: each call fails with `TransientError` after
    one try (`retries=0`: the consumer's own retries take over), whatever the machine's
    load; counted by the listener, not timed."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.settimeout(0.05)
        accepted = 0
        stop = threading.Event()

        def drop_each() -> None:
            nonlocal accepted
            while not stop.is_set():
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                accepted += 1
                conn.close()

        dropper = threading.Thread(target=drop_each, daemon=True)
        dropper.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        try:
            async with s3_client_resource(url, REGION, "contract", SECRET, connect_timeout=1,
                                          read_timeout=1, retries=0) as client:
                store = S3BlobStore(client, "far-away")
                with pytest.raises(TransientError, match="far-away"):
                    await store.put("k", b"x", PDF)
                with pytest.raises(TransientError):
                    await store.exists("k")
        finally:
            stop.set()
            dropper.join(5)
    assert accepted == 4  # two connections per call (today's botocore and aiohttp): no loop


async def test_s3_ensure_bucket_is_idempotent(s3_client: Any) -> None:
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    await ensure_bucket(s3_client, bucket)
    await ensure_bucket(s3_client, bucket)
    assert await S3BlobStore(s3_client, bucket).keys() == []


async def test_s3_ensure_bucket_without_create_finds_but_never_creates(s3_client: Any) -> None:
    """Production's way: a mistyped bucket name stops start-up instead of making a bucket."""
    bucket = f"contract-{uuid.uuid4().hex[:12]}"
    with pytest.raises(PermanentError, match=f"{bucket}.*find bucket"):
        await ensure_bucket(s3_client, bucket, create=False)
    await ensure_bucket(s3_client, bucket)
    await ensure_bucket(s3_client, bucket, create=False)


async def test_s3_every_request_names_the_expected_bucket_owner(s3_client: Any) -> None:
    """S3's ExpectedBucketOwner on every request the store and the start-up make, so a bucket
    of another account (a taken name) answers 403 instead of taking the blobs."""
    bucket, owner, sent = f"contract-{uuid.uuid4().hex[:12]}", "111122223333", []

    def record(request: Any, **_: Any) -> None:
        sent.append((request.method, request.headers.get("x-amz-expected-bucket-owner")))

    s3_client.meta.events.register("before-send.s3", record)
    await ensure_bucket(s3_client, bucket)  # created (locally) before the owner is checked
    sent.clear()
    await ensure_bucket(s3_client, bucket, owner, create=False)
    store = S3BlobStore(s3_client, bucket, expected_owner=owner)
    await store.put("a/1", b"x", PDF)
    assert await store.exists("a/1")
    assert await store.keys("a/") == ["a/1"]
    await store.delete("a/1")
    assert [m for m, _ in sent] == ["HEAD", "PUT", "HEAD", "GET", "DELETE"]
    assert {o for _, o in sent} == {owner.encode()}  # botocore sends header values as bytes


@pytest.mark.parametrize(("code", "status", "error"), [
    ("SlowDown", 503, TransientError),
    ("InternalError", 500, TransientError),
    ("Throttling", 400, TransientError),
    ("RequestTimeout", 400, TransientError),
    ("", 502, TransientError),
    ("AccessDenied", 403, PermanentError),
    ("InvalidAccessKeyId", 403, PermanentError),
])
def test_s3_client_errors_are_classified(code: str, status: int, error: type[Exception]) -> None:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    with pytest.raises(error, match="'bucket-x'"), translated("bucket-x", "put 'k'"):
        raise ClientError(response, "PutObject")


def test_moto_server_refuses_a_taken_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match="in use"):
            MotoServer(port=port).start()


class BlobStoreContract:
    """The `BlobStore` contract. An adapter's test class subclasses it and gives `make`, the
    factory hook: a `Harness` (the store and a way to read an object back behind it), built
    with the test's pytest `request` (for the fixtures it needs), torn down at the end."""

    def make(self, request: pytest.FixtureRequest) -> AbstractAsyncContextManager[Harness]:
        raise NotImplementedError

    @pytest.fixture
    async def blobs(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        async with self.make(request) as harness:
            yield harness

    async def test_put_then_exists_and_keys(self, blobs: Harness) -> None:
        await blobs.store.put("a/1", b"one", PDF)
        assert await blobs.store.exists("a/1")
        assert not await blobs.store.exists("a/2")
        assert await blobs.store.keys() == ["a/1"]

    async def test_put_overwrites(self, blobs: Harness) -> None:
        await blobs.store.put("report", b"first", PDF)
        await blobs.store.put("report", b"second", "text/plain")
        content, media_type = await blobs.read_back("report")
        assert content == b"second"
        assert media_type in ("text/plain", None)
        assert await blobs.store.keys() == ["report"]

    async def test_keys_filter_by_prefix_and_sort(self, blobs: Harness) -> None:
        for key in ("receipts/a", "invoices/b", "invoices-archive/z", "invoices/a", "zz"):
            await blobs.store.put(key, b"x", PDF)
        assert await blobs.store.keys("invoices/") == ["invoices/a", "invoices/b"]
        # A prefix is a string prefix, not a folder; '-' sorts before '/'.
        assert await blobs.store.keys("invoices") == [
            "invoices-archive/z", "invoices/a", "invoices/b"]
        assert await blobs.store.keys() == [
            "invoices-archive/z", "invoices/a", "invoices/b", "receipts/a", "zz"]
        assert await blobs.store.keys("nothing/") == []

    async def test_delete_is_idempotent(self, blobs: Harness) -> None:
        await blobs.store.put("gone", b"x", PDF)
        await blobs.store.delete("gone")
        assert not await blobs.store.exists("gone")
        await blobs.store.delete("gone")
        await blobs.store.delete("never-stored")
        assert await blobs.store.keys() == []

    async def test_nested_attempt_unique_keys(self, blobs: Harness) -> None:
        ids = sorted(str(uuid.uuid4()) for _ in range(3))
        flat = [f"invoices/{i}" for i in ids]
        nested = f"invoices/2030/{ids[0]}"
        for key in [*flat, nested]:
            await blobs.store.put(key, key.encode(), PDF)
        assert await blobs.store.keys("invoices/") == sorted([*flat, nested])
        await blobs.store.delete(flat[0])
        assert not await blobs.store.exists(flat[0])
        assert await blobs.store.exists(nested)
        assert await blobs.store.keys("invoices/2030/") == [nested]
        assert await blobs.store.keys("invoices/") == sorted([*flat[1:], nested])

    async def test_binary_content_round_trips(self, blobs: Harness) -> None:
        content = bytes(range(256)) * 64 + b"\x00\r\n\xff"
        await blobs.store.put("bin/all-bytes", content, PDF)
        await blobs.store.put("bin/empty", b"", "application/octet-stream")
        assert await blobs.read_back("bin/all-bytes") in ((content, PDF), (content, None))
        assert (await blobs.read_back("bin/empty"))[0] == b""


class TestMemoryBlobStore(BlobStoreContract):
    @asynccontextmanager
    async def make(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        memory = MemoryBlobStore()

        async def from_dict(key: str) -> tuple[bytes, str | None]:
            return memory.objects[key]

        yield Harness(memory, from_dict)


class TestLocalDirectoryBlobStore(BlobStoreContract):
    @asynccontextmanager
    async def make(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        root: Path = request.getfixturevalue("tmp_path")

        async def from_file(key: str) -> tuple[bytes, str | None]:
            return (root / key).read_bytes(), None

        yield Harness(LocalDirectoryBlobStore(root), from_file)


class TestS3BlobStore(BlobStoreContract):
    @asynccontextmanager
    async def make(self, request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
        endpoint = request.getfixturevalue("moto_endpoint")  # started only when S3 runs
        async with s3_client_resource(endpoint, REGION, "contract", SECRET) as client:
            bucket = f"contract-{uuid.uuid4().hex[:12]}"  # a fresh bucket per test
            await ensure_bucket(client, bucket)

            async def from_s3(key: str) -> tuple[bytes, str | None]:
                response = await client.get_object(Bucket=bucket, Key=key)
                async with response["Body"] as body:
                    return await body.read(), response["ContentType"]

            # Two keys per page, so that every listing below crosses page boundaries.
            yield Harness(S3BlobStore(client, bucket, page_size=2), from_s3)
