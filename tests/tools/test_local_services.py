"""`eo local-services` (tools/local_services.py): one S3 API for every process of the local
profile, outliving the command that started it (issue 26: competing consumers each started a
moto server of their own and lost each other's blobs)."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from typer.testing import CliRunner

from entrypoints.cli import app

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

runner = CliRunner()


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, ["local-services", *args], env=env)
    return result.exit_code, result.stdout, result.stderr


def _url(out: str) -> str:
    found = re.search(r"^export EO_S3_ENDPOINT_URL=(\S+)$", out, re.M)
    assert found, out
    return found[1]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "local-services.json"
    try:
        yield path
    finally:
        _run("down", "--state", str(path))  # whatever the test left


def _bucket(url: str) -> object:
    return boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id="local", aws_secret_access_key="local")


def test_up_starts_one_s3_api_that_outlives_it_and_down_stops_it(
        state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EO_S3_ENDPOINT_URL", raising=False)
    code, out, err = _run("up", "--state", str(state))
    assert code == 0, err
    url = _url(out)
    assert "export EO_S3_ACCESS_KEY=local" in out
    assert "S3 API (moto) started" in err
    # an S3 API, serving whoever uses those settings: a blob one process writes, another reads
    writer, reader = _bucket(url), _bucket(url)
    writer.create_bucket(Bucket="eo-invoices")  # type: ignore[attr-defined]
    writer.put_object(Bucket="eo-invoices", Key="k", Body=b"blob")  # type: ignore[attr-defined]
    got = reader.get_object(Bucket="eo-invoices", Key="k")  # type: ignore[attr-defined]
    assert got["Body"].read() == b"blob"

    code, again, err = _run("up", "--state", str(state))  # a second up: the same server
    assert code == 0, err
    assert _url(again) == url
    assert "already running" in err
    code, out, _ = _run("status", "--state", str(state))
    assert code == 0
    assert _url(out) == url

    code, _, err = _run("down", "--state", str(state))
    assert code == 0, err
    assert not state.exists()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
    assert _run("status", "--state", str(state))[0] == 1
    assert _run("down", "--state", str(state))[0] == 0  # nothing to stop: fine


def test_up_starts_nothing_when_the_configured_s3_api_answers(state: Path) -> None:
    code, out, err = _run("up", "--state", str(state))
    assert code == 0, err
    url = _url(out)
    code, out, err = _run("up", "--state", str(state.parent / "other.json"),
                          env={"EO_S3_ENDPOINT_URL": url})
    assert code == 0, err
    assert _url(out) == url
    assert "nothing to start" in err
    assert not (state.parent / "other.json").exists()
