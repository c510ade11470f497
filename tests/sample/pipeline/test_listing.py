"""The bucket listing split over key ranges (boto3 in Spark tasks) and S3 Inventory reports."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from adapters.s3.moto_server import MotoServer
from tests.sample.pipeline.audit_data import s3_client
from tools.pipeline.listing import (
    ListingError,
    S3Location,
    list_bucket,
    read_inventory,
    split_prefix,
)

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Keys on and around the split points, at the top level and under several prefixes.
KEYS = ["invoices/", "invoices/0", "invoices/0fff", "invoices/1", "invoices/1\U0010ffff",
        "invoices/8", "invoices/9zz", "invoices/a", "invoices/f", "invoices/ff", "invoices/g",
        "invoices/~", "invoices/Z", "invoices/é", "loose-key", "reports/x/y", "reports/8"]


@pytest.fixture(scope="module")
def bucket() -> Iterator[S3Location]:
    server = MotoServer()
    url = server.start()
    client = s3_client(url)
    client.create_bucket(Bucket="eo-pipeline-listing")
    for key in KEYS:
        client.put_object(Bucket="eo-pipeline-listing", Key=key, Body=b"12345")
    yield S3Location("eo-pipeline-listing", url, "us-east-1", "test", "test")
    server.stop()


def test_split_ranges_cover_each_key_exactly_once() -> None:
    ranges = split_prefix("p/", "8f3")
    assert [(r.start, r.stop) for r in ranges] == [
        (None, "p/3"), ("p/3", "p/8"), ("p/8", "p/f"), ("p/f", None)]
    for key in ["p/", "p/0", "p/3", "p/37", "p/8", "p/e\U0010ffff", "p/f", "p/z"]:
        assert sum(r.contains(key) for r in ranges) == 1, key
    assert not any(r.contains("q/3") for r in ranges)


def test_the_split_listing_equals_the_bucket(spark: SparkSession, bucket: S3Location) -> None:
    rows = list_bucket(spark, bucket, splits="f8a1").collect()
    assert sorted(r["key"] for r in rows) == sorted(KEYS)
    assert {r["size"] for r in rows} == {5}
    assert all(r["last_modified"] is not None for r in rows)


def test_a_missing_bucket_is_named(spark: SparkSession, bucket: S3Location) -> None:
    gone = S3Location("eo-pipeline-absent", bucket.endpoint_url, "us-east-1", "test", "test")
    with pytest.raises(ListingError, match="eo-pipeline-absent"):
        list_bucket(spark, gone)


def test_a_csv_inventory_report_with_its_manifest(spark: SparkSession, tmp_path: Path) -> None:
    schema = "Bucket, Key, Size, LastModifiedDate, IsLatest, IsDeleteMarker"
    (tmp_path / "manifest.json").write_text(json.dumps({"fileSchema": schema}))
    lines = ['b,invoices%2Fa%20b,10,2026-01-01T00:00:00.000Z,true,false',
             'b,invoices%2Fold,11,2025-01-01T00:00:00.000Z,false,false',
             'b,invoices%2Fgone,12,2025-01-01T00:00:00.000Z,true,true',
             'b,invoices%2F%C3%A9,13,2026-01-02T00:00:00.000Z,true,false']
    with gzip.open(tmp_path / "data-1.csv.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    rows = read_inventory(spark, tmp_path).orderBy("key").collect()
    assert [(r["key"], r["size"]) for r in rows] == [("invoices/a b", 10), ("invoices/é", 13)]
    assert rows[0]["last_modified"].year == 2026


def test_a_missing_inventory_is_named(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(ListingError, match="--inventory"):
        read_inventory(spark, tmp_path / "nothing")
