"""The local-directory `BlobStore`: put, exists, keys, idempotent delete, refused keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from adapters.localfs.blob_store import LocalDirectoryBlobStore


@pytest.fixture
def store(tmp_path: Path) -> LocalDirectoryBlobStore:
    return LocalDirectoryBlobStore(tmp_path / "blobs")


async def test_the_root_is_created(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b"
    store = LocalDirectoryBlobStore(root)
    assert root.is_dir()
    assert await store.keys() == []


async def test_put_then_exists_and_the_file_holds_the_content(
    store: LocalDirectoryBlobStore,
) -> None:
    assert not await store.exists("receipts/1")
    await store.put("receipts/1", b"total 12.00\n", "text/plain")
    assert await store.exists("receipts/1")
    assert (store.root / "receipts" / "1").read_bytes() == b"total 12.00\n"


async def test_put_overwrites(store: LocalDirectoryBlobStore) -> None:
    await store.put("k", b"first", "text/plain")
    await store.put("k", b"second, longer", "text/plain")
    assert (store.root / "k").read_bytes() == b"second, longer"
    assert await store.keys() == ["k"]


async def test_keys_are_sorted_and_filtered_by_prefix(store: LocalDirectoryBlobStore) -> None:
    for key in ["slips/b", "receipts/2", "receipts/1", "receipts-old/9", "top"]:
        await store.put(key, key.encode(), "text/plain")
    assert await store.keys() == ["receipts-old/9", "receipts/1", "receipts/2", "slips/b", "top"]
    assert await store.keys("receipts/") == ["receipts/1", "receipts/2"]
    assert await store.keys("receipts") == ["receipts-old/9", "receipts/1", "receipts/2"]
    assert await store.keys("nothing/") == []


async def test_delete_is_idempotent(store: LocalDirectoryBlobStore) -> None:
    await store.put("receipts/1", b"x", "text/plain")
    await store.put("receipts/2", b"y", "text/plain")
    await store.delete("receipts/1")
    await store.delete("receipts/1")
    await store.delete("never/stored")
    assert not await store.exists("receipts/1")
    assert await store.keys() == ["receipts/2"]


@pytest.mark.parametrize(
    "key", ["../escape", "a/../../escape", "a/..", "..", "/etc/passwd", "/tmp/x"]
)
async def test_keys_leaving_the_root_are_refused(store: LocalDirectoryBlobStore, key: str) -> None:
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.put(key, b"x", "text/plain")
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.exists(key)
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.delete(key)
    assert await store.keys() == []
    assert not (store.root.parent / "escape").exists()


async def test_no_temporary_file_is_left_or_listed(store: LocalDirectoryBlobStore) -> None:
    await asyncio.gather(
        *(store.put(f"receipts/{i}", bytes(1000) * i, "text/plain") for i in range(10))
    )
    assert await store.keys() == sorted(f"receipts/{i}" for i in range(10))
    assert [p.name for p in store.root.rglob("*") if p.name.endswith(".tmp")] == []


async def test_a_half_written_temporary_file_is_never_a_key(
    store: LocalDirectoryBlobStore,
) -> None:
    """A crash between writing the temporary file and the rename leaves it behind: it is
    not an object (a reader never sees half an object)."""
    await store.put("receipts/1", b"complete", "text/plain")
    (store.root / "receipts" / ".2.tmp").write_bytes(b"half")
    assert await store.keys() == ["receipts/1"]
    assert await store.keys("receipts/") == ["receipts/1"]
    assert not await store.exists("receipts/2")
