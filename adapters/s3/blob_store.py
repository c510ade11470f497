"""Blobs as S3 objects (aioboto3): the `local` and `production` profiles' `BlobStore`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aioboto3
import aiohttp
from aiobotocore.config import AioConfig
from botocore.exceptions import (
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from application.errors import PermanentError, TransientError
from application.ports import BlobStore

#: S3 error codes after which a retry may succeed (throttling, server trouble, a conflicting
#: operation still running); any 5xx, 408 and 429 count as transient too.
_TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled",
    "TooManyRequestsException", "RequestLimitExceeded", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "OperationAborted",
    "PriorRequestNotComplete",
})
_TRANSIENT_STATUSES = frozenset({408, 429})

#: Network failures: botocore's wrappers, and raw aiohttp and OS errors as a safety net
#: should one get through aiobotocore unwrapped.
_NETWORK = (BotoConnectionError, HTTPClientError, aiohttp.ClientError, TimeoutError, OSError)

#: What an operator should check for the usual permanent codes. The server's own message is
#: left out of ours: we only vouch that what we build names no credentials.
_HINTS = {
    "NoSuchBucket": "the bucket does not exist",
    "404": "not found (a HEAD of a missing bucket or key)",
    "AccessDenied": "access denied: check the credentials' permissions on the bucket",
    "InvalidAccessKeyId": "the endpoint does not know the access key",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "BucketAlreadyExists": "the bucket name is taken by another account",
}


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextmanager
def translated(bucket: str, action: str) -> Iterator[None]:
    """Translate S3 failures inside the block into the application's errors.

    Raises `TransientError` for network errors and timeouts, throttling and 5xx (left after
    botocore's own bounded retries), `PermanentError` for other client errors (NoSuchBucket,
    AccessDenied, ...) and missing credentials. Messages name `bucket` and `action`, never
    credentials. Anything else (e.g. botocore's ParamValidationError, a bug) passes unchanged.
    """
    try:
        yield
    except ClientError as exc:
        code, status = _code(exc), _status(exc)
        where = f"S3 bucket {bucket!r}: {action} failed with {code or 'no code'} (HTTP {status})"
        if code in _TRANSIENT_CODES or status >= 500 or status in _TRANSIENT_STATUSES:
            raise TransientError(where) from exc
        hint = _HINTS.get(code)
        raise PermanentError(f"{where}: {hint}" if hint else where) from exc
    except (NoCredentialsError, PartialCredentialsError) as exc:
        raise PermanentError(f"S3 bucket {bucket!r}: {action} failed: no usable credentials"
                             ) from exc
    except _NETWORK as exc:
        raise TransientError(f"S3 bucket {bucket!r}: {action} failed: "
                             f"{type(exc).__name__}: {exc}") from exc


class S3BlobStore(BlobStore):
    """Each key is an object in `bucket`, reached through `client`, an open aioboto3 S3
    client (see `s3_client_resource`); the store does not close it.

    `put` sends the media type as the object's Content-Type. `keys` lists `page_size` keys
    per request (S3's maximum is 1000). `exists` needs s3:ListBucket besides s3:GetObject:
    without it S3 answers 403 for a missing key, which raises `PermanentError`. A missing
    bucket makes `put`, `delete` and `keys` raise `PermanentError`, but `exists` return
    False: a HEAD response carries no error code to tell the two 404s apart. With
    `expected_owner` (an AWS account ID), every request carries S3's `ExpectedBucketOwner`:
    a bucket of another account (a name taken over, a typo) answers 403 instead of taking
    the blobs. All methods raise as `translated` describes.
    """

    def __init__(self, client: Any, bucket: str, page_size: int = 1000,
                 expected_owner: str | None = None) -> None:
        self.client = client
        self.bucket = bucket
        self.page_size = page_size
        self._where: dict[str, str] = {"Bucket": bucket}
        if expected_owner is not None:
            self._where["ExpectedBucketOwner"] = expected_owner

    async def put(self, key: str, content: bytes, media_type: str) -> None:
        with translated(self.bucket, f"put {key!r}"):
            await self.client.put_object(**self._where, Key=key, Body=content,
                                         ContentType=media_type)

    async def delete(self, key: str) -> None:
        # S3 answers 204 for a missing key, so deleting twice needs no special case.
        with translated(self.bucket, f"delete {key!r}"):
            await self.client.delete_object(**self._where, Key=key)

    async def exists(self, key: str) -> bool:
        found = True
        with translated(self.bucket, f"head {key!r}"):
            try:
                await self.client.head_object(**self._where, Key=key)
            except ClientError as exc:
                if _status(exc) != 404:
                    raise
                found = False
        return found

    async def keys(self, prefix: str = "") -> list[str]:
        found: list[str] = []
        with translated(self.bucket, f"list {prefix!r}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                **self._where, Prefix=prefix, PaginationConfig={"PageSize": self.page_size})
            async for page in pages:
                found.extend(obj["Key"] for obj in page.get("Contents", ()))
        # S3 lists in UTF-8 byte order, which is code-point order; sorting keeps the port's
        # promise for S3-compatible stores that do not.
        return sorted(found)


@asynccontextmanager
async def s3_client_resource(
    endpoint_url: str | None,
    region: str,
    access_key: str | None,
    secret_key: str | None,
    *,
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
    retries: int = 3,
) -> AsyncIterator[Any]:
    """An aioboto3 S3 client, closed on exit: `async with`, or a dependency-injector
    `Resource` (which accepts async context managers).

    `endpoint_url` None means AWS itself; set it for MinIO or moto. Keys None mean botocore's
    default credential chain. Addressing is path-style (`endpoint/bucket/key`), which MinIO
    and moto need. Timeouts are in seconds. `retries` bounds the retries after the first try
    (botocore's `max_attempts`, which, unlike `total_max_attempts`, does not count the first
    try) in botocore's standard mode: connection errors, throttling and 5xx are retried with
    jittered exponential backoff (up to 1, 2, 4 s). Raises ValueError when only one of the
    two keys is given.
    """
    if (access_key is None) != (secret_key is None):
        raise ValueError("S3 access key and secret key must be given together")
    session = aioboto3.Session(aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                               region_name=region)
    config = AioConfig(s3={"addressing_style": "path"},
                       retries={"max_attempts": retries, "mode": "standard"},
                       connect_timeout=connect_timeout, read_timeout=read_timeout)
    async with session.client("s3", endpoint_url=endpoint_url, config=config) as client:
        yield client


async def ensure_bucket(client: Any, bucket: str, expected_owner: str | None = None,
                        create: bool = True) -> None:
    """Check that `bucket` exists (owned by `expected_owner` when given), and with `create`
    create it in the client's region when it does not (idempotent, also when two processes
    race). Raises `PermanentError` when it is missing and not to be created, the name
    belongs to another account, or access is denied; `TransientError` when the endpoint does
    not answer."""
    owner = {"ExpectedBucketOwner": expected_owner} if expected_owner else {}
    with translated(bucket, "create bucket" if create else "find bucket"):
        try:
            await client.head_bucket(Bucket=bucket, **owner)
            return
        except ClientError as exc:
            if _status(exc) != 404 or not create:
                raise
        region = client.meta.region_name
        # us-east-1 is S3's default location and refuses to be named as a constraint.
        where = ({} if region in (None, "us-east-1")
                 else {"CreateBucketConfiguration": {"LocationConstraint": region}})
        try:
            await client.create_bucket(Bucket=bucket, **where)
        except ClientError as exc:
            if _code(exc) != "BucketAlreadyOwnedByYou":  # a concurrent caller created it
                raise
