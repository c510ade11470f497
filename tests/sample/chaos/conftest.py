"""Fixtures of the chaos tests: one `Cluster` per module (processes, moto, databases), one
`Run` per test. A module sets `GENERAL_PATH = True` to run on a separate token database
(protocol 3.2's general path: every artifact registered, created and re-checked)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.sample.chaos.cluster import Cluster, Run, make_cluster
from tools.zygote import Zygote


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Cluster]:
    general = bool(getattr(request.module, "GENERAL_PATH", False))
    tmp: Path = tmp_path_factory.mktemp("chaos")
    zygote = Zygote()
    made, moto = make_cluster(tmp, zygote, general_path=general)
    try:
        yield made
    finally:
        made.destroy()
        moto.stop()
        zygote.close()


@pytest.fixture
async def chaos(cluster: Cluster) -> AsyncIterator[Run]:
    run = Run(cluster)
    try:
        await run.open()
        yield run
    finally:
        await run.close()
