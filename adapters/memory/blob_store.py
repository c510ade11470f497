"""Blobs in a dict: `BlobStore` for unit tests."""

from __future__ import annotations

import asyncio

from application.ports import BlobStore


class MemoryBlobStore(BlobStore):
    """Objects keyed by name, with their media type."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}

    async def put(self, key: str, content: bytes, media_type: str) -> None:
        await asyncio.sleep(0)
        self.objects[key] = (content, media_type)

    async def delete(self, key: str) -> None:
        await asyncio.sleep(0)
        self.objects.pop(key, None)

    async def exists(self, key: str) -> bool:
        await asyncio.sleep(0)
        return key in self.objects

    async def keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))
