"""The bucket's object listing as a Spark DataFrame (`key`, `size`, `last_modified`): listed
live through boto3 by Spark tasks, each over one key range, or read from an S3 Inventory
report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The listing's columns: key (string), size (bytes, long), last_modified (timestamp, UTC).
LISTING_SCHEMA = "key string, size long, last_modified timestamp"
#: Default split characters: artifact keys are `<prefix>/<uuid>`, so the hex digits spread
#: them evenly (keys starting with any other character still fall into some range).
HEX_SPLITS = "123456789abcdef"
#: The AWS default `fileSchema` of a CSV inventory report (the manifest.json names it).
DEFAULT_INVENTORY_SCHEMA = "Bucket, Key, Size, LastModifiedDate"
_MAX_CHAR = "\U0010ffff"


class ListingError(RuntimeError):
    """The bucket or the inventory report cannot be read; the message names which."""


@dataclass(frozen=True)
class S3Location:
    """A bucket and how to reach it (endpoint None: AWS; keys None: boto3's default chain)."""

    bucket: str
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key: str | None = None
    secret_key: str | None = None

    def client(self) -> Any:
        """A boto3 S3 client (path-style addressing, standard retries)."""
        import boto3
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"},
                        retries={"max_attempts": 5, "mode": "standard"},
                        connect_timeout=5, read_timeout=60)
        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name=self.region,
                            aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, config=config)


@dataclass(frozen=True)
class KeyRange:
    """Keys under `prefix` with `start` <= key < `stop` (None: unbounded on that side)."""

    prefix: str
    start: str | None = None
    stop: str | None = None

    def contains(self, key: str) -> bool:
        """Whether `key` lies in the range (code-point order, which is S3's UTF-8 order)."""
        return (key.startswith(self.prefix) and (self.start is None or key >= self.start)
                and (self.stop is None or key < self.stop))


def split_prefix(prefix: str, splits: str = HEX_SPLITS) -> list[KeyRange]:
    """Ranges covering every key under `prefix` exactly once, cut before `prefix + c` for each
    character `c` of `splits` (sorted and deduplicated): len(set(splits)) + 1 ranges."""
    cuts = [prefix + c for c in sorted(set(splits))]
    bounds: list[str | None] = [None, *cuts, None]
    return [KeyRange(prefix, bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]


def list_range(location: S3Location, key_range: KeyRange) -> Iterator[tuple[str, int, datetime]]:
    """(key, size, last_modified) of the objects in `key_range`, in key order, paged by S3's
    ListObjectsV2 from just below `start` (StartAfter) until the first key >= `stop`."""
    client = location.client()
    args: dict[str, Any] = {"Bucket": location.bucket, "Prefix": key_range.prefix}
    if key_range.start:
        # strictly below `start` yet above every key below it that S3 would list first
        last = key_range.start[-1]
        args["StartAfter"] = key_range.start[:-1] + chr(ord(last) - 1) + _MAX_CHAR
    for page in client.get_paginator("list_objects_v2").paginate(**args):
        for obj in page.get("Contents", ()):
            key = obj["Key"]
            if key_range.stop is not None and key >= key_range.stop:
                return
            if key_range.contains(key):
                yield key, int(obj["Size"]), obj["LastModified"]


def plan_ranges(location: S3Location, splits: str = HEX_SPLITS
                ) -> tuple[list[KeyRange], list[tuple[str, int, datetime]]]:
    """The key ranges to list in parallel: each top-level prefix (up to the first "/") split
    by `split_prefix`; and the objects at the top level (no "/"), listed here already.

    Raises ListingError when the bucket cannot be listed (missing, no access, no answer).
    """
    from botocore.exceptions import BotoCoreError, ClientError

    client = location.client()
    ranges: list[KeyRange] = []
    top: list[tuple[str, int, datetime]] = []
    try:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket,
                                                                  Delimiter="/")
        for page in pages:
            for common in page.get("CommonPrefixes", ()):
                ranges.extend(split_prefix(common["Prefix"], splits))
            top.extend((o["Key"], int(o["Size"]), o["LastModified"])
                       for o in page.get("Contents", ()))
    except (BotoCoreError, ClientError) as exc:
        raise ListingError(f"S3 bucket {location.bucket!r} at "
                           f"{location.endpoint_url or 'AWS'}: listing failed: {exc} "
                           "(check EO_S3_BUCKET, EO_S3_ENDPOINT_URL and the keys)") from exc
    return ranges, top


def list_bucket(spark: SparkSession, location: S3Location, splits: str = HEX_SPLITS
                ) -> DataFrame:
    """The bucket's objects as a DataFrame of LISTING_SCHEMA, listed by one Spark task per
    key range (see `plan_ranges`); the tasks need boto3 and reach the endpoint themselves.
    Raises ListingError as `plan_ranges`."""
    ranges, top = plan_ranges(location, splits)
    top_frame = spark.createDataFrame(top, LISTING_SCHEMA)
    if not ranges:
        return top_frame
    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).flatMap(
        lambda r: list_range(location, r))
    return spark.createDataFrame(rdd, LISTING_SCHEMA).unionByName(top_frame)


def _inventory_schema(path: Path) -> str:
    manifest = (path if path.is_dir() else path.parent) / "manifest.json"
    if manifest.is_file():
        return str(json.loads(manifest.read_text())["fileSchema"])
    return DEFAULT_INVENTORY_SCHEMA


def read_inventory(spark: SparkSession, path: Path) -> DataFrame:
    """An S3 Inventory report as a DataFrame of LISTING_SCHEMA.

    `path`: a data file or a directory of them (manifest.json, if there, is skipped). Parquet
    and ORC reports carry their column names (`key`, `size`, `last_modified_date`, optional
    `is_latest`/`is_delete_marker`); CSV reports (gzip or not) have none: their order is the
    `fileSchema` of a manifest.json next to them, else DEFAULT_INVENTORY_SCHEMA, and their
    keys are URL-encoded. Only current, non-deleted versions are kept.
    Raises ListingError when `path` does not exist or lacks a key, size or date column.
    """
    if not path.exists():
        raise ListingError(f"--inventory {path}: no such file or directory")
    files = ([p for p in sorted(path.iterdir()) if p.is_file() and p.name != "manifest.json"
              and not p.name.startswith((".", "_"))] if path.is_dir() else [path])
    if not files:
        raise ListingError(f"--inventory {path}: no report files")
    names = [p.name for p in files]
    if all(".parquet" in n for n in names) or all(".orc" in n for n in names):
        fmt = "parquet" if ".parquet" in names[0] else "orc"
        frame = spark.read.format(fmt).load([str(p) for p in files])
        frame = frame.toDF(*(c.lower() for c in frame.columns))
        key_expr = "key"
    else:
        columns = [c.strip() for c in _inventory_schema(path).split(",")]
        snake = ["".join("_" + ch.lower() if ch.isupper() else ch for ch in c).lstrip("_")
                 for c in columns]
        frame = spark.read.csv([str(p) for p in files], header=False).toDF(*snake)
        key_expr = "url_decode(key)"
    for needed in ("key", "size", "last_modified_date"):
        if needed not in frame.columns:
            raise ListingError(f"--inventory {path}: no {needed} column (found "
                               f"{', '.join(frame.columns)})")
    if "is_latest" in frame.columns:
        frame = frame.where("CAST(is_latest AS boolean)")
    if "is_delete_marker" in frame.columns:
        frame = frame.where("NOT coalesce(CAST(is_delete_marker AS boolean), false)")
    return frame.selectExpr(f"{key_expr} AS key", "CAST(size AS bigint) AS size",
                            "CAST(last_modified_date AS timestamp) AS last_modified")
