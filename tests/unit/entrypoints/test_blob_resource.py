"""The blob store a process builds (`entrypoints.resources.blob_resource`) where its S3 API is not
there: the local profile without `EO_S3_ENDPOINT_URL` starts moto, a development dependency
the image does not carry; without it, start-up stops naming the settings (issue 26: the image
died with a 125-line traceback ending in `No module named 'moto'`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from entrypoints.resources import blob_resource
from entrypoints.settings import SettingsError, load_settings
from tests.support.counters.registry import REGISTRY  # its `counter` endpoint makes blobs


async def test_the_local_profile_without_moto_or_an_s3_endpoint_names_the_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "moto", None)  # as in the image: not installed
    monkeypatch.delenv("EO_S3_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("EO_BLOB_STORE", raising=False)
    settings = load_settings(profile="local")
    with pytest.raises(SettingsError) as caught:
        await anext(blob_resource(settings, REGISTRY))
    message = str(caught.value)
    assert "EO_S3_ENDPOINT_URL" in message
    assert "EO_BLOB_STORE=directory" in message
    assert "moto" in message


async def test_a_directory_needs_no_s3_api(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "moto", None)
    resource = blob_resource(load_settings(profile="local", blob_store="directory",
                                           blob_dir=tmp_path), REGISTRY)
    store = await anext(resource)
    assert store is not None
    await store.put("a/b.txt", b"x", "text/plain")
    assert (tmp_path / "a" / "b.txt").read_bytes() == b"x"
    await resource.aclose()
