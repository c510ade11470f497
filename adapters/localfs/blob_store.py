"""Blobs as files under a directory: the embedded profile's `BlobStore`."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from application.ports import BlobStore


class LocalDirectoryBlobStore(BlobStore):
    """Each key is a file path under `root` (keys with `..` or a leading `/` are refused
    with ValueError). Writes go to a temporary file renamed into place, so a reader never
    sees half an object. Blocking file I/O runs in a worker thread."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in Path(key).parts:
            raise ValueError(f"invalid blob key {key!r}")
        return self.root / key

    async def put(self, key: str, content: bytes, media_type: str) -> None:
        path = self._path(key)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(content)
            os.replace(tmp, path)

        await asyncio.to_thread(write)

    async def delete(self, key: str) -> None:
        await asyncio.to_thread(self._path(key).unlink, True)

    async def exists(self, key: str) -> bool:
        return await asyncio.to_thread(self._path(key).is_file)

    async def keys(self, prefix: str = "") -> list[str]:
        def scan() -> list[str]:
            found = (p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                     if p.is_file() and not p.name.startswith("."))
            return sorted(k for k in found if k.startswith(prefix))

        return await asyncio.to_thread(scan)
